"""Rate limiters deciding how long a failing item waits before its next try (client-go's workqueue limiters)."""

from __future__ import annotations

import time
from typing import Callable, Hashable, Protocol


class RateLimiter(Protocol):
    """``when(item)`` is the delay before the item's next try (and counts a try); ``forget`` resets the item."""

    def when(self, item: Hashable) -> float: ...

    def forget(self, item: Hashable) -> None: ...

    def num_requeues(self, item: Hashable) -> int: ...


class ItemExponentialFailureRateLimiter:
    """Per item: ``base * 2**failures``, capped at ``cap``."""

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        """Delay for the item's next try."""
        n = self._failures.get(item, 0)
        self._failures[item] = n + 1
        if n > 64:  # 2**n would overflow the float long before; the cap applies anyway
            return self.cap
        return min(self.base * 2.0 ** n, self.cap)

    def forget(self, item: Hashable) -> None:
        """Reset the item's failures."""
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        """How many times the item has been rate-limited since it was last forgotten."""
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """A token bucket shared by all items: ``qps`` tokens a second, ``burst`` at most."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: Hashable) -> float:
        """Reserve a token; the delay until it is available."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, item: Hashable) -> None:
        """Tokens are not per item: nothing to forget."""

    def num_requeues(self, item: Hashable) -> int:
        """Not tracked by a bucket."""
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters; requeues counted by the first one that counts them."""

    def __init__(self, *limiters: RateLimiter) -> None:
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        """The maximum of the limiters' delays (each counts the try)."""
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: Hashable) -> None:
        """Forget the item in every limiter."""
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        """The largest count among the limiters."""
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter() -> RateLimiter:
    """client-go's default: per-item 5 ms doubling to 1000 s, and 10 qps with a burst of 100 overall."""
    return MaxOfRateLimiter(ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(10.0, 100))
