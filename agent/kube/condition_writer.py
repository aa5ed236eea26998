"""The condition writer: this Node's conditions of the agent (those whose
type carries ``condition_prefix``) made to match the desired ones.

Only our own entries are sent (a strategic-merge patch of
``status.conditions`` merges by type: see `nodes`), only when one changed,
and again every ``condition_heartbeat`` so that a stale condition shows its
age. In a dry run, what would be sent is logged once per change and exported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .api import KubeApi
from .nodecopy import NodeCopy, Once
from .nodes import conditions_of, plan_conditions
from .policy import DesiredCondition
from .settings import KubernetesSection

log = logging.getLogger(__name__)


class ConditionWriter:
    def __init__(self, cfg: KubernetesSection, node: NodeCopy, *, api: KubeApi | None, wall: Callable[[], float]) -> None:
        self.cfg, self.node, self.api, self.wall = cfg, node, api, wall
        self.would: set[tuple[str, ...]] = set()
        self.heartbeat_at = 0.0
        self._once = Once()

    def sync(self, now: float, desired: tuple[DesiredCondition, ...] | list[DesiredCondition], dry_run: bool) -> None:
        assert self.api is not None
        heartbeat = self.cfg.condition_heartbeat > 0 and now >= self.heartbeat_at
        items = plan_conditions(conditions_of(self.node.obj), desired, self.cfg.condition_prefix, self.wall(), heartbeat)
        self.would = set()
        if not items:
            return
        if dry_run:
            self.would = {(c["type"], c.get("status", "deleted"), "dry_run") for c in items}
            if self._once("conditions", str(items)):
                log.warning("dry run: would PATCH nodes/%s/status conditions %s", self.node.name, items)
            return
        self.node.obj = self.api.patch_node_status(self.node.name, {"status": {"conditions": items}})
        self.heartbeat_at = now + self.cfg.condition_heartbeat
        log.info("conditions of node %s: %s", self.node.name,
                 ", ".join(f"{c['type']}={c.get('status', 'deleted')}" for c in items))
