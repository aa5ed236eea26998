"""The Xid catalog (``agent/data/xid_catalog.csv``) and how one kernel-log or
NVML event becomes a verdict: reason, severity, recommended action, and how
long the finding stays.

The catalog rows come from NVIDIA's Xid catalog for Ampere and later
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): the
"Resolution Bucket (Immediate Action)" is kept in ``bucket`` and mapped to one
of `ACTIONS` and a severity. Application Xids (RESTART_APP, IGNORE) are
``info``: they are shown and counted but are not node faults. Operators
override the severity per Xid in ``[checks.gpu.xid_severity]``.

How long a finding stays (`Verdict.sticky`): an Xid whose action is
``reset_gpu``, ``reboot``, ``drain_and_diagnose`` or ``rma`` stays until the
node reboots (a new boot id); ``reset_gpu`` ones also end when the NVIDIA
driver is loaded again (``NVRM: loading NVIDIA UNIX …`` after the Xid: a driver
reload resets every GPU) or the remediation ladder verified a reset of that GPU
(`agent.gpu.resets`). Xids whose action is ``none`` or ``restart_app`` stay
for ``app_xid_hold`` only: the GPU itself is fine once the application is gone.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..findings import ACTIONS, Severity
from ..parsers.xid import KIND_FALLEN_OFF_BUS, KIND_RMINIT_FAILED, KIND_SXID, KIND_XID

STICKY_ACTIONS = frozenset({"reset_gpu", "reboot", "drain_and_diagnose", "rma"})



def hold(action: str) -> str:
    """How long a finding for an Xid with this action stays (what `Verdict.sticky` and the
    stream's driver-reload rule do), in words for the docs."""
    if action not in STICKY_ACTIONS:
        return "`app_xid_hold` (5 min) after the event: the GPU is fine once the application is gone"
    if action == "reset_gpu":
        return ("until the node reboots, until the NVIDIA driver is loaded again (`NVRM: loading NVIDIA UNIX …` "
                "after the Xid: a reload resets every GPU), or until the remediation ladder verified a reset of that GPU")
    return "until the node reboots (a new boot id)"


XID_FALLEN_OFF_BUS = 79
XID_PREEMPTIVE_CLEANUP = 45
XID_RECOVERY_ACTION = 154
NVLINK5_XIDS = frozenset(range(144, 151))
# Every Xid the code treats specially; a test holds them in the catalog.
SPECIAL_XIDS = frozenset({XID_FALLEN_OFF_BUS, XID_PREEMPTIVE_CLEANUP, XID_RECOVERY_ACTION, *NVLINK5_XIDS})

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230) values, also announced by
# Xid 154 ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset
# Required)", gpu.c): parse the code, not the text, which varies by driver.
RECOVERY_ACTIONS: Mapping[int, tuple[str, str, Severity]] = {
    0: ("None", "none", Severity.INFO),
    1: ("GPU reset required", "reset_gpu", Severity.CRITICAL),
    2: ("Node reboot required", "reboot", Severity.CRITICAL),
    3: ("Drain P2P", "drain_and_diagnose", Severity.WARNING),
    4: ("Drain and reset", "reset_gpu", Severity.CRITICAL),
    5: ("Recover IMEX domain", "drain_and_diagnose", Severity.WARNING),
    6: ("Bus reset required", "reset_gpu", Severity.CRITICAL),
    7: ("System reboot required", "reboot", Severity.CRITICAL),
}
_RECOVERY_TO = re.compile(r"to (0x[0-9a-fA-F]+)")
# Xid 144-150 lines say "<UNIT> Fatal|Nonfatal XC0 i0 Link 04 (…)".
_NVLINK5_NONFATAL = re.compile(r"\bNonfatal\b")


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    mnemonic: str
    severity: Severity
    action: str
    bucket: str
    meaning: str

    @property
    def reason(self) -> str:
        return f"Xid{self.xid}"


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str
    severity: Severity
    action: str
    sticky: bool  # stays until reboot (see the module doc)
    title: str  # "Xid 79 (GPU has fallen off the bus)"
    xid: int  # the Xid number, 79 for a fallen-off-bus line, 0 when none


@cache
def catalog() -> Mapping[int, XidInfo]:
    text = resources.files("agent").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    out: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(text)):
        info = XidInfo(
            int(row["xid"]), row["mnemonic"], Severity(row["severity"]), row["action"], row["bucket"], row["meaning"]
        )
        if info.action not in ACTIONS:
            raise ValueError(f"xid_catalog.csv: Xid {info.xid}: unknown action {info.action!r}")
        out[info.xid] = info
    return out


def lookup(xid: int) -> XidInfo | None:
    return catalog().get(xid)


def metric_label(xid: int) -> str:
    """The ``xid`` label: catalog Xids by number, every other one as "other" (bounded)."""
    return str(xid) if xid in catalog() else "other"


def classify(kind: int, xid: int, message: str, overrides: Mapping[int, Severity] | None = None) -> Verdict | None:
    """The verdict for one parsed event; None for kinds that are not findings."""
    if kind == KIND_FALLEN_OFF_BUS:
        kind, xid = KIND_XID, XID_FALLEN_OFF_BUS
    if kind == KIND_XID:
        return _xid_verdict(xid, message, overrides or {})
    if kind == KIND_SXID:
        fatal = message.startswith("Fatal")
        sev = Severity.CRITICAL if fatal else Severity.WARNING
        action = "drain_and_diagnose" if fatal else "none"
        return Verdict("NvSwitchSXid", sev, action, fatal, f"NVSwitch SXid {xid}", xid)
    if kind == KIND_RMINIT_FAILED:
        return Verdict("GpuInitFailed", Severity.CRITICAL, "reboot", True, "GPU failed to initialise (RmInitAdapter)", 0)
    return None


def _xid_verdict(xid: int, message: str, overrides: Mapping[int, Severity]) -> Verdict:
    info = lookup(xid)
    if info is None:
        # Not in the catalog: NVSentinel and gpud treat unknown Xids as "contact support".
        sev, action, reason, title = Severity.WARNING, "drain_and_diagnose", "XidOther", f"Xid {xid} (not in the catalog)"
    else:
        sev, action, reason, title = info.severity, info.action, info.reason, f"Xid {xid} ({info.meaning})"
    if xid in NVLINK5_XIDS and _NVLINK5_NONFATAL.search(message):
        sev = Severity.WARNING
    if xid == XID_RECOVERY_ACTION:
        m = _RECOVERY_TO.search(message)
        if m and int(m.group(1), 16) in RECOVERY_ACTIONS:
            name, action, sev = RECOVERY_ACTIONS[int(m.group(1), 16)]
            title = f"Xid 154 (GPU recovery action changed to {name})"
    sev = overrides.get(xid, sev)
    return Verdict(reason, sev, action, action in STICKY_ACTIONS, title, xid)
