"""The event path: events wait in an outbox, persisted with the hysteresis
state, until the API server took them.

A transition's events are queued in the same atomic state write as the
transition itself, so a crash between deciding and sending loses nothing; a
retryable error (429, 5xx, connection) leaves the event at the head of the
outbox for the reconciler's next try; an event the API server refuses for
good is dropped and counted. The outbox is bounded (`OUTBOX_MAX`, oldest
dropped first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .api import ApiError, Stats
from .events import EventRecorder
from .policy import EventSpec

log = logging.getLogger(__name__)

OUTBOX_MAX = 100


class Outbox:
    def __init__(
        self,
        saved: list[dict[str, str]],
        node_name: str,
        *,
        recorder: EventRecorder | None,
        stats: Stats,
        wall: Callable[[], float],
        persist: Callable[[], None],
    ) -> None:
        self.items: list[dict[str, str]] = list(saved)[-OUTBOX_MAX:]
        self.node_name = node_name
        self.recorder, self.stats, self.wall, self._persist = recorder, stats, wall, persist
        self._last_ns = 0

    def __bool__(self) -> bool:
        return bool(self.items)

    def queue(self, specs: list[EventSpec], persist: bool = True) -> None:
        for spec in specs:
            self.items.append({"type": spec.type, "reason": spec.reason, "action": spec.action, "note": spec.note,
                               "name": self._event_name()})
        if len(self.items) > OUTBOX_MAX:
            log.warning("event outbox full: dropping %d oldest events", len(self.items) - OUTBOX_MAX)
            del self.items[:-OUTBOX_MAX]
        if specs and persist:
            self._persist()

    def flush(self, now: float, uid: str, dry_run: bool) -> None:
        """Send what waits, oldest first; a retryable error stops here (the event stays)."""
        while self.items:
            item = self.items[0]
            spec = EventSpec(item["type"], item["reason"], item["action"], item["note"])
            if dry_run or self.recorder is None:
                log.warning("dry run: would create event %s %s: %s", spec.type, spec.reason, spec.note)
                result = "dry_run"
            else:
                try:
                    name = item.get("name") or self._event_name()
                    result = self.recorder.send(spec, uid, now, self.wall(), name)
                except ApiError as exc:
                    if exc.retryable:
                        raise
                    log.error("event %s refused, dropping it: %s", spec.reason, exc)
                    result = "failed"
            self.stats.event(result)
            self.items.pop(0)
            self._persist()

    def drain_without_cluster(self) -> None:
        """No cluster: log what would be sent, and forget it."""
        while self.items:
            item = self.items.pop(0)
            log.warning("dry run (no cluster): would create event %s %s: %s", item["type"], item["reason"], item["note"])
            self._persist()

    def _event_name(self) -> str:
        """client-go's <object>.<unix nanoseconds>, kept strictly increasing (one step can queue several)."""
        self._last_ns = max(int(self.wall() * 1e9), self._last_ns + 1)
        return f"{self.node_name}.{self._last_ns:x}"
