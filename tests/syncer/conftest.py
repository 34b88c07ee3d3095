"""Fixtures of the syncer tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.sidecar import Sidecar


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Starts Sidecars (``Sidecar``'s arguments after ``tmp_path``); those still running are killed afterwards."""
    started: list[Sidecar] = []

    def start(*args: Any, **kw: Any) -> Sidecar:
        s = Sidecar(tmp_path, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
