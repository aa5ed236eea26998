"""The application's registry: every check the agent has, imported by name,
and the one catalog of every reason and metric the agent can emit.

Adding a check means adding its adapter module (``agent/checks/<name>.py``)
here (docs/architecture.md). Its order is the order of `agent selftest` and of
the config reference. Adapters keep heavy imports (pyroute2, pynvml, iptc,
kubernetes) inside functions, so importing this module costs none of them.
`CATALOG` is passed to the scheduler, the metrics renderer and the Kubernetes
policy; a test that needs other reasons builds its own `Catalog`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .burn import catalog as burn_catalog
from .catalog import CORE_METRICS, CORE_REASONS, Catalog, MetricSpec, Reason
from .check import CheckSpec
from .checks import burn, disk, gpu, gpu_pods, gpu_telemetry, infiniband, kernel, network, traffic
from .disk import catalog as disk_catalog
from .gpu import catalog as gpu_catalog
from .infiniband import catalog as infiniband_catalog
from .kernel import catalog as kernel_catalog
from .kube import catalog as kube
from .network import catalog as network_catalog
from .remediation import catalog as remediation
from .traffic import catalog as traffic_catalog
from .web import CATALOG as WEB_CATALOG
from .web import METRICS as WEB_METRICS

CHECKS: Mapping[str, CheckSpec] = MappingProxyType(
    {spec.name: spec for spec in (disk.SPEC, network.SPEC, infiniband.SPEC, gpu.SPEC, gpu_telemetry.SPEC, gpu_pods.SPEC, kernel.SPEC, traffic.SPEC, burn.SPEC)}
)

# The names findings carry besides the checks' own: an event source's name -> the check it belongs to
# (CheckSpec.finding_sources). `agent selftest --only xid` runs the gpu check, whose single pass reports its Xids.
FINDING_SOURCES: Mapping[str, str] = MappingProxyType(
    {source: spec.name for spec in CHECKS.values() for source in spec.finding_sources}
)

CATALOG: Catalog = Catalog.merge(*(spec.catalog for spec in CHECKS.values()), kube.CATALOG, remediation.CATALOG, WEB_CATALOG)


def configured_reasons(checks: Mapping[str, object]) -> list[tuple[str, str, Reason]]:
    """The reasons the checks' configurations name beyond the catalog (`CheckSpec.reasons`): (check,
    key under [checks.<check>], the reason's entry), in check order."""
    out: list[tuple[str, str, Reason]] = []
    for name, spec in CHECKS.items():
        cfg = checks.get(name)
        if spec.reasons is not None and cfg is not None:
            out.extend((name, key, reason) for key, reason in spec.reasons(cfg))
    return out


def catalog_for(checks: Mapping[str, object]) -> Catalog:
    """The daemon's catalog: `CATALOG` and the reasons these check configurations name; a reload
    declares its own with `Catalog.configure`."""
    catalog = CATALOG.configurable()
    catalog.configure(r for _, _, r in configured_reasons(checks))
    return catalog


# What each feature declares, by feature name ("core": the agent's own): the
# per-feature tables of docs/*.md are generated from it (`agent docs reasons gpu`).
FEATURES: Mapping[str, tuple[tuple[Reason, ...], tuple[MetricSpec, ...]]] = MappingProxyType({
    "core": (CORE_REASONS, CORE_METRICS),
    "disk": (disk_catalog.REASONS, disk_catalog.METRICS),
    "network": (network_catalog.REASONS, network_catalog.METRICS),
    "infiniband": (infiniband_catalog.REASONS, infiniband_catalog.METRICS),
    "gpu": (gpu_catalog.REASONS, gpu_catalog.METRICS),
    "gpu_telemetry": ((), gpu_catalog.TELEMETRY_METRICS),
    "kernel": (kernel_catalog.REASONS, kernel_catalog.METRICS),
    "traffic": (traffic_catalog.REASONS, traffic_catalog.METRICS),
    "burn": (burn_catalog.REASONS, burn_catalog.METRICS),
    "kube": (kube.REASONS, kube.METRICS),
    "remediation": (remediation.REASONS, remediation.METRICS),
    "web": ((), WEB_METRICS),
})
