"""Opt-in debug endpoints (setting ``debug_endpoints``): what pprof's goroutine dump and block profile are to a
Go controller.

- ``/debug/tasks``: every asyncio task with its name, state and the stack it is suspended at (text).
- ``/debug/stalls``: the recent times the event loop did not come round for ``STALL`` seconds or more, each with
  how long it lasted and where the loop's thread was when it was caught (JSON).

Stalls are caught from outside the loop: a heartbeat task marks the loop alive every ``_BEAT`` seconds, and a
watchdog thread that sees the mark go stale takes the loop thread's stack (``sys._current_frames``), once per
stall. Unlike asyncio's debug mode (``slow_callback_duration``), this costs the loop nothing but the heartbeat,
and it works on uvloop, whose callbacks asyncio cannot time.
"""

from __future__ import annotations

import asyncio
import collections
import io
import sys
import threading
import time
import traceback
from typing import Any

STALL = 0.1  # seconds without a heartbeat that count as a stall
_BEAT = 0.02
_KEPT = 50  # stalls remembered


class StallWatch:
    """The heartbeat (a task of the loop) and the watchdog (a daemon thread), started and stopped together."""

    def __init__(self, threshold: float = STALL) -> None:
        self.threshold = threshold
        self.stalls: collections.deque[dict[str, Any]] = collections.deque(maxlen=_KEPT)
        self._beat = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()

    def start(self) -> None:
        """Start both; call from the loop's thread."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="debug: event loop heartbeat")
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="debug: event loop watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop both and wait for them."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def _heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(_BEAT)

    def _watch(self) -> None:
        # The loop thread reads the stalls (report) while this thread writes them: a stall's dict only ever has
        # its "seconds" replaced, a single store, never keys added or removed.
        current: dict[str, Any] | None = None
        stalled_at = 0.0  # the last beat before the stall going on
        while not self._stop.wait(_BEAT):
            beat = self._beat
            late = time.monotonic() - beat
            if current is not None and stalled_at != beat:  # the loop came round again
                current["seconds"] = round(beat - stalled_at, 3)
                current = None
            if current is None and late >= self.threshold + _BEAT:
                frame = sys._current_frames().get(self._loop_thread)
                stack = traceback.format_stack(frame) if frame is not None else []
                current, stalled_at = {"at": time.time() - late, "seconds": None, "stack": "".join(stack)}, beat
                self.stalls.append(current)

    def report(self) -> list[dict[str, Any]]:
        """The stalls remembered, newest last; ``seconds`` is None for one still going on."""
        return [dict(s) for s in list(self.stalls)]


def task_dump() -> str:
    """Every task of the running loop, its state and the stack it waits at."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    out.write(f"{len(tasks)} tasks\n")
    for task in tasks:
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", type(coro).__name__)
        state = "cancelling" if task.cancelling() else "done" if task.done() else "pending"
        out.write(f"\n--- {task.get_name()} ({state}): {name}\n")
        for frame in task.get_stack():
            out.write("".join(traceback.format_stack(frame, limit=1)))
    return out.getvalue()
