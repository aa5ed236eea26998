"""Hang-prone calls (statfs on a dead NFS mount, a connect, an NVML call on a
GPU that fell off the bus) run in their own daemon thread with a deadline.

A call that does not return in time is left running (a thread in D state
cannot be killed) and reported; until it returns, the same key is not probed
again, so a dead mount costs one thread, not one per interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProbeResult(Generic[T]):
    value: T | None = None
    error: BaseException | None = None
    hung_for: float | None = None  # seconds the call has been running when it is (still) hung

    @property
    def ok(self) -> bool:
        return self.error is None and self.hung_for is None


class PendingCall:
    """One probe call, in a thread here or in the probe worker process (agent.probeproc)."""

    __slots__ = ("done", "error", "started", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None
        self.started = time.monotonic()

    def finish(self, value: object = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.set()


class Prober:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._hung: dict[Hashable, PendingCall] = {}

    def call(self, key: Hashable, fn: Callable[[], T], timeout: float) -> ProbeResult[T]:
        """`fn()` in a thread of its own."""

        def start(call: PendingCall) -> None:
            def work() -> None:
                try:
                    call.finish(fn())
                except BaseException as exc:  # noqa: BLE001 - reported to the caller as a result
                    call.finish(error=exc)

            threading.Thread(target=work, name=f"probe-{self.name}-{key}", daemon=True).start()

        return self.run(key, start, timeout)

    def run(self, key: Hashable, start: Callable[[PendingCall], None], timeout: float) -> ProbeResult[T]:
        """Start one call for `key` (`start` arranges for the call to be
        finished, wherever it runs) and wait up to `timeout` for it; while an
        earlier call for `key` hangs, none is started and the hang is reported."""
        with self._lock:
            old = self._hung.get(key)
            if old is not None:
                if not old.done.is_set():
                    return ProbeResult(hung_for=time.monotonic() - old.started)
                del self._hung[key]
        call = PendingCall()
        start(call)
        if not call.done.wait(timeout):
            with self._lock:
                self._hung[key] = call
            return ProbeResult(hung_for=time.monotonic() - call.started)
        return ProbeResult(value=call.value, error=call.error)  # type: ignore[arg-type]

    def hung(self) -> list[Hashable]:
        with self._lock:
            return [k for k, c in self._hung.items() if not c.done.is_set()]
