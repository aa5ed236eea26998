"""What the writers of one Node share: the agent's copy of the Node object
(the last answer the API server gave) and a memory of what was logged.

The taint writer, the condition writer and the event path each update or
read the copy; the reconciler decides when it is read again (at start, on a
jittered resync, after a 409).
"""

from __future__ import annotations

from typing import Any


class NodeCopy:
    def __init__(self, name: str) -> None:
        self.name = name
        self.obj: dict[str, Any] | None = None  # None: read it before writing
        self.stale = False  # a 409 said our resourceVersion is old: read the node itself, not the watch cache

    def uid(self) -> str:
        return str(((self.obj or {}).get("metadata") or {}).get("uid", ""))


class Once:
    """Log once per state change, per topic."""

    def __init__(self) -> None:
        self._seen: dict[str, object] = {}

    def __call__(self, topic: str, value: object) -> bool:
        """True the first time `value` is seen for `topic`."""
        if self._seen.get(topic) == value:
            return False
        self._seen[topic] = value
        return True

    def forget(self, topic: str) -> None:
        self._seen.pop(topic, None)
