"""Finding reasons for the Kubernetes tests (installed into the catalog by a fixture).

Test-only names ("Fake…") so they can never collide with a real check's reasons.
"""

from __future__ import annotations

from agent.catalog import Reason
from agent.findings import Severity

REASONS = (
    Reason("FakeDiskFull", Severity.CRITICAL, "test: a critical disk problem", family="Disk"),
    Reason("FakeDiskSlow", Severity.WARNING, "test: a warning disk problem", family="Disk"),
    Reason("FakeGpuLost", Severity.CRITICAL, "test: a critical GPU problem", family="GPU"),
    Reason("FakeNicFlap", Severity.WARNING, "test: a warning network problem", family="Network"),
    Reason("FakeProbeError", Severity.WARNING, "test: cannot tell", unknown=True, family="Disk"),
)
METRICS = ()
