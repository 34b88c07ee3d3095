"""Access reviews: whether the user may list and watch a GVR, asked with SelfSubjectAccessReview.

As in kcp's syncer, a GVR the user may not list and watch gets no informer (its watch would only fail and
retry forever) and is reported with the reason. Unlike it, a review that fails in transit (the API server
restarting, a cut connection, a 5xx) is not a verdict: the GVR keeps its previous verdict or, never decided,
stays undecided and is asked again on the next pass; the pass itself goes on. All reviews of one pass are
bounded together, so a server that accepts connections but does not answer cannot hold a pass for
(GVRs x timeout).
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from loguru import logger

from .client import CONNECTION_ERRORS, ApiClient
from .errors import ApiError
from .gvr import GVR

_VERBS = ("list", "watch")
_CONCURRENCY = 16


class AccessReviewsFailed(Exception):
    """Some access reviews of a pass failed: those GVRs kept their previous verdict, or are ``undecided``."""

    def __init__(self, cause: Exception, failed: list[GVR], undecided: list[GVR]) -> None:
        super().__init__(f"{len(failed)} access review(s) failed, e.g. for {failed[0]} ({cause!r}); "
                         f"{len(undecided)} GVR(s) undecided until the next pass")
        self.cause = cause
        self.failed = failed
        self.undecided = undecided


class AccessReviewer:
    """Remembers, per GVR, None (allowed) or the reason it is forbidden; ``check`` asks the server."""

    def __init__(self, client: ApiClient, namespace: str | None = None, timeout: float = 10.0) -> None:
        self.client = client
        self.namespace = namespace
        self.timeout = timeout
        self.budget = 2 * timeout  # for all the reviews of one pass
        self._verdicts: dict[GVR, str | None] = {}
        self._log = logger.bind(component="access-review")

    def decided(self, gvr: GVR) -> bool:
        """Whether a verdict is known for ``gvr``."""
        return gvr in self._verdicts

    def denied(self, gvr: GVR) -> str | None:
        """Why the user may not watch ``gvr``; None if allowed (or undecided: ask ``decided`` first)."""
        return self._verdicts.get(gvr)

    async def check(self, gvrs: Iterable[GVR], recheck_forbidden: bool) -> AccessReviewsFailed | None:
        """Ask about the undecided GVRs (and the forbidden ones too with ``recheck_forbidden``).

        Verdicts of GVRs not in ``gvrs`` are forgotten. If reviews failed, the GVRs concerned keep their
        previous verdicts (or stay undecided) and the returned error says so, for the caller to log once.
        """
        wanted = set(gvrs)
        self._verdicts = {g: v for g, v in self._verdicts.items() if g in wanted}
        todo = [g for g in wanted if g not in self._verdicts or (recheck_forbidden and self._verdicts[g])]
        failures: list[tuple[GVR, Exception]] = []
        pending = set(todo)
        sem = asyncio.Semaphore(_CONCURRENCY)

        async def one(gvr: GVR) -> None:
            try:
                async with sem:
                    denied = [verb for verb in _VERBS if not await self._allowed(gvr, verb)]
            except (ApiError, *CONNECTION_ERRORS) as e:
                pending.discard(gvr)
                failures.append((gvr, e))
                return
            pending.discard(gvr)
            reason = f"user may not {' or '.join(denied)} {gvr}" if denied else None
            if reason and self._verdicts.get(gvr) != reason:
                self._log.warning("not watching {}: {}", gvr, reason)
            self._verdicts[gvr] = reason

        try:
            async with asyncio.timeout(self.budget):
                await asyncio.gather(*(one(g) for g in todo))
        except TimeoutError:
            late = TimeoutError(f"access reviews took longer than {self.budget:g}s")
            failures.extend((g, late) for g in pending)
        if not failures:
            return None
        return AccessReviewsFailed(failures[0][1], [gvr for gvr, _ in failures],
                                   [gvr for gvr, _ in failures if gvr not in self._verdicts])

    async def _allowed(self, gvr: GVR, verb: str) -> bool:
        attrs = {"verb": verb, "group": gvr.group, "version": gvr.version, "resource": gvr.resource}
        if self.namespace:
            attrs["namespace"] = self.namespace
        review = await self.client.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}}, timeout=self.timeout)
        return bool((review.get("status") or {}).get("allowed"))
