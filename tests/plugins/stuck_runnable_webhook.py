"""Test plugin: a ``failurePolicy: Fail`` webhook on ConfigMaps labelled ``test=fatal-exit``, next to a runnable
that swallows its cancellation and never stops (so that a stop request ends in exit code 1)."""

from __future__ import annotations

import asyncio
from typing import Any

from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, ValidatingWebhook, Verdict


class Stubborn:
    name = "stubborn"

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    async def shutdown(self) -> None:
        pass


async def allow(request: AdmissionRequest) -> Verdict:
    return Allow()


def syncer_webhooks(settings: dict[str, Any]) -> list[ValidatingWebhook]:
    return [ValidatingWebhook("fatal-exit.configmaps.example.com", allow,
                              [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])], failure_policy="Fail",
                              object_selector={"matchLabels": {"test": "fatal-exit"}})]


def syncer_runnables(settings: dict[str, Any]) -> list[Stubborn]:
    return [Stubborn()]
