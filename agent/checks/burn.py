"""GPU burn test: the preflight once per boot (and an optional periodic
re-test), run by an event source (`agent.burn.preflight`) so that "pending" is
reported the moment the agent starts; the polled check only shows the
persisted result (what `agent selftest` and `agent run --once` print).
See docs/burn.md."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..burn.catalog import CATALOG
from ..burn.catalog import METRICS as METRICS
from ..burn.catalog import REASONS as REASONS
from ..burn.settings import BurnConfig, known, runner
from ..check import CheckContext, CheckSpec
from ..findings import Observation, ObservationBuilder

if TYPE_CHECKING:
    from ..burn.model import BurnReport
    from ..sources import EventSource


class BurnStatusCheck:
    """Shows the persisted result of this boot's burns; never burns. Where no source runs beside it
    (selftest, run --once) it reports the findings the preflight source would, so those judge as the daemon."""

    name = "burn"

    def __init__(self, ctx: CheckContext, cfg: BurnConfig) -> None:
        self.ctx, self.cfg = ctx, cfg

    def run(self) -> Observation:
        from ..burn.preflight import BurnState
        from ..burn.publish import findings
        from ..statedir import StateDir, boot_id

        b = ObservationBuilder(self.name, CATALOG)
        st = BurnState.load(StateDir(self.ctx.state_dir), boot_id(self.ctx.paths))
        for label, report in (("preflight", st.preflight), ("periodic", st.retest)):
            if report is not None:
                b.subject(label, _describe(report))
                if self.ctx.single_pass:  # else the preflight source publishes them
                    for f in findings(report, label):
                        b.finding(f.subject, f.reason, f.message)
        if st.preflight is None and self.cfg.preflight:
            b.subject("preflight", "no burn in this boot yet (the agent runs it at start)")
        return b.build()


def _describe(report: BurnReport) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.finished))
    tested = f"{len(report.gpus)} GPU(s), {report.backend}" if report.gpus else report.note or report.unavailable
    return f"{report.status} at {when} ({tested})"


def sources(ctx: CheckContext, cfg: BurnConfig) -> list[EventSource]:
    from ..burn.idle import Idleness, pod_lookup
    from ..burn.preflight import Options, PreflightSource
    from ..statedir import StateDir, boot_id

    opts = Options(preflight=cfg.preflight, force=cfg.preflight_force, retest_interval=cfg.retest_interval,
                   dry_run=ctx.dry_run, hold_while_deferred=cfg.hold_while_deferred, retry=cfg.interval)
    burner = runner(ctx.paths, cfg, ctx.config.check("gpu"))
    pods = ctx.config.check("gpu_pods")  # where the kubelet's PodResources socket is
    sock = pods.pod_resources_socket
    lookup = pod_lookup(ctx.paths.root(sock), pods.call_timeout, pods.resource_names) if sock else None
    idle = Idleness(burner.inventory, lookup)
    state, boot = StateDir(ctx.state_dir), (lambda: boot_id(ctx.paths))
    return [PreflightSource(burner, state, boot, opts, lambda: known(ctx.paths), idle)]


SPEC = CheckSpec(
    name="burn",
    summary="GPU burn test: once per boot on idle GPUs before the node takes work (preflight), optionally again when idle.",
    config=BurnConfig,
    build=BurnStatusCheck,
    catalog=CATALOG,
    sources=sources,
)
