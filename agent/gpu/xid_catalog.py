"""The Xid catalog (``agent/data/xid_catalog.csv``) and how one kernel-log or
NVML event becomes a verdict: reason, severity, recommended action, and how
long the finding stays.

The catalog rows come from NVIDIA's Xid catalog for Ampere and later
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): the
"Resolution Bucket (Immediate Action)" is kept in ``bucket``, and each Xid's
severity and action are derived from it (`BUCKETS`). A row departs from the
derivation only with its reason written in its ``deviation`` column (then its
``severity`` and/or ``action`` columns say what it is instead); a test holds
every row. Where the catalog grades one Xid by the event itself, so does the
verdict: NVLink5 Xids 144-150 by the severity the driver prints on the line
(Fatal: reset the GPU; Nonfatal: a warning with no action), Xid 154 by the
recovery action it announces. Application Xids (RESTART_APP, IGNORE) are
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
_NVLINK5_GRADE = re.compile(r"^\s*[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)?\s+(Fatal|Nonfatal)\b")


# NVIDIA's immediate resolution bucket -> (severity, action, why). The action
# names what NVIDIA says to do; the severity whether it is a node fault at all.
BUCKETS: Mapping[str, tuple[Severity, str, str]] = {
    "RESTART_APP": (Severity.INFO, "restart_app", "the application's error: the GPU is fine once it is gone"),
    "IGNORE": (Severity.INFO, "none", "NVIDIA: no action"),
    "RESET_GPU": (Severity.CRITICAL, "reset_gpu", "NVIDIA: reset the GPU"),
    "RESTART_BM": (Severity.CRITICAL, "reboot", "NVIDIA: restart the (bare-metal) node"),
    "RESTART_VM": (Severity.CRITICAL, "reboot", "NVIDIA: restart the VM, which is the node the agent runs on"),
    "CONTACT_SUPPORT": (Severity.CRITICAL, "drain_and_diagnose", "NVIDIA: contact support; the node is drained and diagnosed first"),
    "CHECK_MECHANICALS": (Severity.CRITICAL, "drain_and_diagnose", "NVIDIA: check the hardware (power cables, seating) by hand"),
    "CHECK_UVM": (Severity.WARNING, "drain_and_diagnose", "NVIDIA: check the UVM driver, a software matter to diagnose"),
    "WORKFLOW_XID_48": (Severity.CRITICAL, "drain_and_diagnose", "NVIDIA's Xid 48 workflow: reset with Xid 63/64, else field diagnostics"),
    "WORKFLOW_XID_45": (Severity.INFO, "none", "NVIDIA's Xid 45 workflow: follow the Xid that caused the cleanup"),
    "WORKFLOW_NVLINK_ERR": (Severity.CRITICAL, "drain_and_diagnose", "NVIDIA's NVLink workflow: decode the registers, reseat, run diagnostics"),
    "WORKFLOW_NVLINK5_ERR": (
        Severity.WARNING, "none",
        "graded by the line: Fatal: critical, reset the GPU; Nonfatal: warning, no action; "
        "an event without its line (NVML's) is a warning with no action until the line is read",
    ),
    "XID_154": (
        Severity.WARNING, "none",
        "follows the recovery action it announces; without one, a warning with no action",
    ),
}
# 144-150 as NVIDIA grades them by the severity printed on the line (gpud too:
# Nonfatal is a warning; NVSentinel resets only the decode sheet's RESET_GPU rows).
NVLINK5_FATAL = (Severity.CRITICAL, "reset_gpu")
NVLINK5_NONFATAL = (Severity.WARNING, "none")


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid: int
    mnemonic: str
    severity: Severity
    action: str
    bucket: str
    meaning: str
    deviation: str = ""  # why severity/action differ from what the bucket derives ("" when they do not)

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


def derived(bucket: str) -> tuple[Severity, str] | None:
    """What NVIDIA's bucket says: (severity, action); None for an empty or unknown bucket."""
    entry = BUCKETS.get(bucket)
    return None if entry is None else (entry[0], entry[1])


def parse_catalog(text: str, where: str = "xid_catalog.csv") -> dict[int, XidInfo]:
    out: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(text)):
        xid, deviation = int(row["xid"]), row["deviation"].strip()
        base = derived(row["bucket"])
        if row["bucket"] and base is None:
            raise ValueError(f"{where}: Xid {xid}: unknown resolution bucket {row['bucket']!r}")
        if base is None and not (row["severity"] and row["action"]):
            raise ValueError(f"{where}: Xid {xid}: no bucket, so severity and action are needed (and a deviation)")
        default = base or (Severity.INFO, "none")
        severity = Severity(row["severity"]) if row["severity"] else default[0]
        action = row["action"] or default[1]
        if action not in ACTIONS:
            raise ValueError(f"{where}: Xid {xid}: unknown action {action!r}")
        if (base != (severity, action)) != bool(deviation):
            raise ValueError(
                f"{where}: Xid {xid}: " + ("a deviation without a reason" if not deviation else "a reason for no deviation")
            )
        out[xid] = XidInfo(xid, row["mnemonic"], severity, action, row["bucket"], row["meaning"], deviation)
    return out


@cache
def catalog() -> Mapping[int, XidInfo]:
    return parse_catalog(resources.files("agent").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8"))


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
    if xid in NVLINK5_XIDS:
        m = _NVLINK5_GRADE.match(message)
        if m:
            sev, action = NVLINK5_FATAL if m.group(1) == "Fatal" else NVLINK5_NONFATAL
            title = f"Xid {xid} ({info.meaning if info else 'NVLink error'}, {m.group(1)})"
    if xid == XID_RECOVERY_ACTION:
        m = _RECOVERY_TO.search(message)
        if m and int(m.group(1), 16) in RECOVERY_ACTIONS:
            name, action, sev = RECOVERY_ACTIONS[int(m.group(1), 16)]
            title = f"Xid 154 (GPU recovery action changed to {name})"
    sev = overrides.get(xid, sev)
    return Verdict(reason, sev, action, action in STICKY_ACTIONS, title, xid)
