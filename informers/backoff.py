"""Backoff: client-go's reflector backoff (0.8 s doubling to 30 s, jitter, reset after a quiet spell)."""

from __future__ import annotations

import random
import time
from typing import Callable


class Backoff:
    """Exponential backoff with multiplicative jitter that resets after ``reset_after`` seconds without errors."""

    def __init__(
        self, initial: float = 0.8, factor: float = 2.0, cap: float = 30.0, jitter: float = 1.0,
        reset_after: float = 120.0, clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.factor, self.cap, self.jitter = initial, factor, cap, jitter
        self.reset_after = reset_after
        self._clock, self._rand = clock, rand
        self._current = initial
        self._last: float | None = None

    def next(self) -> float:
        """The delay before the next attempt (and advance the sequence)."""
        now = self._clock()
        if self._last is not None and now - self._last > self.reset_after:
            self._current = self.initial
        self._last = now
        delay = self._current * (1 + self.jitter * self._rand())
        self._current = min(self._current * self.factor, self.cap)
        return delay

    def reset(self) -> None:
        """Start again from the initial delay."""
        self._current = self.initial
        self._last = None
