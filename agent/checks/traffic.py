"""Traffic check (the engine is `agent.traffic.keeper`): keeps the agent's mangle accounting rules in place and
exports what they count (internet-in, internet-out; per address family).

Each run, for each family with internal ranges: read ours from
``iptables-save -c`` (parsed natively), repair whatever is missing, altered or
out of order (counted and logged), and fold the count rules' counters into
monotonic totals kept in the state dir (`agent.traffic.tally`). The backend
(iptables-legacy or iptables-nft) is chosen once per configuration, as
kube-proxy's wrapper chooses it; on the first run, rules of ours found in the
other backend or in a family without internal ranges are removed.

Per pod (``[checks.traffic.pods]``, on by default) it also counts each pod's
internet traffic (`agent.traffic.perpod`); with ``[checks.traffic.shaping]``
enabled, it also limits pods' internet egress (`agent.traffic.shaper`). Both
read the node's pods, hence `needs_pods`.

Needs CAP_NET_ADMIN (and CAP_NET_RAW for legacy): without it, one
InsufficientPrivilege finding and the counters held where they were. In a dry
run (`agent run --dry-run`, `agent selftest`) nothing is changed or written.
"""

from __future__ import annotations

from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder
from ..traffic.catalog import CATALOG
from ..traffic.catalog import METRICS as METRICS
from ..traffic.catalog import REASONS as REASONS
from ..traffic.settings import TrafficConfig as TrafficConfig


class TrafficCheck:
    """Thin shell so that importing this module (the registry does) costs nothing."""

    name = "traffic"

    def __init__(self, ctx: CheckContext, cfg: TrafficConfig) -> None:
        from ..traffic.keeper import Keeper

        self._keeper = Keeper(ctx, cfg)

    def known_findings(self) -> list[tuple[str, str]]:
        return self._keeper.known_findings()

    def run(self) -> Observation:
        b = ObservationBuilder(self.name, CATALOG)
        self._keeper.run(b)
        return b.build()


SPEC = CheckSpec(
    name="traffic",
    summary="Internet vs cluster traffic: mangle accounting rules kept in place, their counters exported.",
    config=TrafficConfig,
    build=TrafficCheck,
    catalog=CATALOG,
    needs_pods=lambda cfg: bool(cfg.pods.enabled or cfg.shaping.enabled),  # per-pod accounting, shaping
    pod_annotations=lambda cfg: (cfg.shaping.annotation,) if cfg.shaping.enabled else (),
)
