"""The application's registry: every check the agent has, imported by name.

Adding a check means adding its adapter module (``agent/checks/<name>.py``)
here. Its order is the order of `agent selftest` and of the config reference.
Adapters keep heavy imports (pyroute2, pynvml, iptc, kubernetes) inside
functions, so importing this module costs none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .check import CheckSpec
from .checks import burn, disk, gpu, network, traffic

CHECKS: Mapping[str, CheckSpec] = MappingProxyType(
    {spec.name: spec for spec in (disk.SPEC, network.SPEC, gpu.SPEC, traffic.SPEC, burn.SPEC)}
)
