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

from .catalog import Catalog
from .check import CheckSpec
from .checks import burn, disk, gpu, network, traffic
from .kube import catalog as kube

CHECKS: Mapping[str, CheckSpec] = MappingProxyType(
    {spec.name: spec for spec in (disk.SPEC, network.SPEC, gpu.SPEC, traffic.SPEC, burn.SPEC)}
)

CATALOG: Catalog = Catalog.merge(*(spec.catalog for spec in CHECKS.values()), kube.CATALOG)
