"""Events about this Node (events.k8s.io/v1), deduplicated and rate-limited.

The Python client has no recorder, so this follows client-go's semantics
(tools/events, tools/record/events_cache.go): events are keyed by type,
action and reason (the note is not part of the key); a repeat of the same key
while its series is live (quiet for less than 6 minutes) PATCHes
``series.count`` of the existing Event instead of creating a new one (a 404
creates it again), and a token bucket (burst 25, one more per 5 minutes by
default) drops what is left of a storm. An Event about a cluster-scoped
object lives in the ``default`` namespace.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .api import ApiError, KubeApi
from .nodes import micro_time, micro_time_str
from .policy import EventSpec
from .ratelimit import TokenBucket

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "node-health-agent"
NAMESPACE = "default"
SERIES_FINISH = 360.0  # client-go tools/events finishTime: 6 minutes
CACHE_MAX = 256


@dataclass(slots=True)
class _Series:
    name: str
    count: int
    last: float  # monotonic


class EventRecorder:
    def __init__(self, api: KubeApi, node: str, *, burst: int, refill: float, now: float) -> None:
        self.api, self.node = api, node
        self._bucket = TokenBucket(1.0 / refill, burst, now)
        self._series: OrderedDict[tuple[str, str, str], _Series] = OrderedDict()

    def send(self, spec: EventSpec, uid: str, now: float, wall: float, name: str) -> str:
        """Send one event; the result for the metric. Raises `Wait` or a retryable `ApiError` to try later.

        `name` is chosen when the event is queued and kept with it in the state
        file: sent again after a crash, the create answers 409 AlreadyExists and
        the event is not duplicated.
        """
        if self._bucket.available(now) < 1:
            log.debug("event %s %s dropped: rate limit", spec.reason, spec.action)
            return "dropped"
        key = (spec.type, spec.action, spec.reason)
        s = self._series.get(key)
        result = "created"
        if s is not None and now - s.last < SERIES_FINISH:
            result = self._patch_series(key, s, wall) or self._create(spec, uid, key, wall, name)
        else:
            self._create(spec, uid, key, wall, name)
        self._series[key].last = now
        self._series.move_to_end(key)
        while len(self._series) > CACHE_MAX:
            self._series.popitem(last=False)
        self._bucket.take(now)
        return result

    def _patch_series(self, key: tuple[str, str, str], s: _Series, wall: float) -> str | None:
        body = {"series": {"count": s.count + 1, "lastObservedTime": micro_time_str(wall)}}
        try:
            self.api.patch_event(NAMESPACE, s.name, body)
        except ApiError as exc:
            if exc.status == 404:  # expired (default TTL 1h): create it again, also if this try is cut short
                del self._series[key]
                return None
            raise
        s.count += 1
        return "series"

    def _create(self, spec: EventSpec, uid: str, key: tuple[str, str, str], wall: float, name: str) -> str:
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "eventTime": micro_time(wall),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": f"{REPORTING_CONTROLLER}-{self.node}"[:128],
            "action": spec.action,
            "reason": spec.reason,
            "note": spec.note,
            "type": spec.type,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid},
        }
        try:
            self.api.create_event(NAMESPACE, body)
        except ApiError as exc:
            if exc.status != 409:  # AlreadyExists: sent before a crash, not yet marked as sent
                raise
        self._series[key] = _Series(name, 1, 0.0)
        return "created"
