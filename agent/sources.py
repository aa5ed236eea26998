"""Event sources: findings pushed as they happen (NVML Xid events, the kernel
log follower), next to the checks that are polled.

A source runs its own thread(s). `emit` replaces the source's active findings
and samples; it is thread-safe and hands the update to the scheduler's loop,
which wakes at once, so nothing waits for the next tick to act on a critical
finding. A check module can declare sources beside its check (`CheckSpec.sources`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from .findings import Finding, Sample

Emit = Callable[[Sequence[Finding], Sequence[Sample]], None]


class EventSource(Protocol):
    name: str

    def start(self, emit: Emit) -> None:
        """Start the source's thread(s); must return promptly."""
        ...

    def stop(self) -> None:
        """Stop and join within a couple of seconds."""
        ...

    def known_findings(self) -> Iterable[tuple[str, str]]:
        """(subject, reason) pairs exported at 0 from start."""
        ...
