"""Client-side pacing: a token bucket for every request and one backoff.

The Python client has no rate limiter of its own (client-go's default is
5 QPS / burst 10), so every request of the agent takes a token here. After a
429, a 5xx or a connection error, *no* request goes out until the backoff has
passed: exponential from 1 s to `backoff_max`, with jitter, and never shorter
than the server's Retry-After (APF computes it per priority level:
https://github.com/kubernetes/apiserver/blob/master/pkg/server/filters/priority-and-fairness.go).
Times are monotonic seconds passed in by the caller, so the fleet simulation
can run the same code in virtual time.
"""

from __future__ import annotations

import random
import threading


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def take(self, now: float) -> float:
        """Take a token and return 0, or return the seconds until one is available (nothing taken)."""
        self._refill(now)
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate

    def available(self, now: float) -> float:
        self._refill(now)
        return self._tokens


class Gate:
    """The rate limit and the backoff every request passes (thread-safe)."""

    BASE = 1.0

    def __init__(self, *, qps: float, burst: int, backoff_max: float, now: float, rng: random.Random | None = None) -> None:
        self._bucket = TokenBucket(qps, burst, now)
        self._max = backoff_max
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._failures = 0
        self._not_before = 0.0

    def admit(self, now: float) -> float:
        """0 when a request may go now (a token is taken), else the monotonic time to try again."""
        with self._lock:
            if now < self._not_before:
                return self._not_before
            wait = self._bucket.take(now)
            return 0.0 if wait == 0 else now + wait

    def failed(self, now: float, retry_after: float | None) -> float:
        """Record a 429/5xx/connection failure; return the time before which nothing is sent."""
        with self._lock:
            self._failures += 1
            expo = min(self._max, self.BASE * 2 ** (self._failures - 1))
            floor = max(retry_after or 0.0, expo)
            # Jitter only upwards: never earlier than Retry-After, and agents
            # that were refused together do not come back together.
            delay = min(max(self._max, retry_after or 0.0), floor * (1 + 0.5 * self._rng.random()))
            self._not_before = max(self._not_before, now + delay)
            return self._not_before

    def succeeded(self) -> None:
        with self._lock:
            self._failures = 0

    @property
    def backing_off_until(self) -> float:
        return self._not_before
