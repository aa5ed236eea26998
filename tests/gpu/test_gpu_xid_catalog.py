"""Every Xid of the catalog as NVIDIA grades it: the severity and action each
row derives from NVIDIA's immediate resolution bucket (or, where the agent
departs from it, the deviation and its written reason), and the Xids NVIDIA
grades by the event itself (NVLink5 144-150 by Fatal/Nonfatal, 154 by the
recovery action it announces). Reference: /work/shared/reference/gpu.md §a.2."""

from __future__ import annotations

import pytest

from agent.findings import Severity
from agent.gpu.xid_catalog import BUCKETS, catalog, classify, derived, parse_catalog
from agent.gpu.xid_tracker import Event, XidStream
from agent.parsers.xid import KIND_XID
from agent.remediation.faults import faults

# xid: (NVIDIA's immediate bucket, severity, action) — the whole catalog, as the agent acts on it
# when the event does not grade itself (144-150 without their line, 154 without an action).
TABLE: dict[int, tuple[str, str, str]] = {
    8: ("RESTART_APP", "info", "restart_app"),
    13: ("RESTART_APP", "info", "restart_app"),
    31: ("RESTART_APP", "info", "restart_app"),
    32: ("RESTART_APP", "info", "restart_app"),
    38: ("IGNORE", "info", "none"),
    43: ("IGNORE", "info", "none"),
    44: ("IGNORE", "info", "none"),
    45: ("WORKFLOW_XID_45", "info", "none"),
    46: ("RESET_GPU", "critical", "reset_gpu"),
    48: ("WORKFLOW_XID_48", "critical", "drain_and_diagnose"),
    54: ("CHECK_MECHANICALS", "critical", "drain_and_diagnose"),
    56: ("CONTACT_SUPPORT", "critical", "drain_and_diagnose"),
    57: ("CONTACT_SUPPORT", "critical", "drain_and_diagnose"),
    58: ("CONTACT_SUPPORT", "critical", "drain_and_diagnose"),
    61: ("CONTACT_SUPPORT", "critical", "drain_and_diagnose"),
    62: ("RESET_GPU", "critical", "reset_gpu"),
    63: ("IGNORE", "info", "none"),
    64: ("RESET_GPU", "critical", "reset_gpu"),
    68: ("RESTART_APP", "info", "restart_app"),
    69: ("RESTART_APP", "info", "restart_app"),
    74: ("WORKFLOW_NVLINK_ERR", "critical", "drain_and_diagnose"),
    79: ("RESTART_BM", "critical", "reboot"),
    92: ("IGNORE", "info", "none"),
    94: ("RESTART_APP", "warning", "restart_app"),
    95: ("RESET_GPU", "critical", "reset_gpu"),
    109: ("RESET_GPU", "critical", "reset_gpu"),
    119: ("RESET_GPU", "critical", "reset_gpu"),
    120: ("RESET_GPU", "critical", "reset_gpu"),
    121: ("IGNORE", "info", "none"),
    136: ("RESET_GPU", "critical", "reset_gpu"),
    137: ("IGNORE", "info", "none"),
    140: ("RESET_GPU", "critical", "reset_gpu"),
    143: ("RESET_GPU", "critical", "reset_gpu"),
    144: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    145: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    146: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    147: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    148: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    149: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    150: ("WORKFLOW_NVLINK5_ERR", "warning", "none"),
    151: ("RESTART_VM", "critical", "reboot"),
    154: ("XID_154", "warning", "none"),
    155: ("RESET_GPU", "critical", "reset_gpu"),
    156: ("RESET_GPU", "critical", "reset_gpu"),
    158: ("RESET_GPU", "critical", "reset_gpu"),
    159: ("CHECK_UVM", "warning", "drain_and_diagnose"),
    167: ("", "critical", "drain_and_diagnose"),
    171: ("", "critical", "drain_and_diagnose"),
    172: ("", "critical", "drain_and_diagnose"),
}
# The rows that depart from their bucket (each with its reason in the CSV's deviation column).
DEVIATIONS = {94: "severity", 167: "no bucket", 171: "no bucket", 172: "no bucket"}


def test_the_table_is_the_whole_catalog() -> None:
    got = {x: (i.bucket, i.severity.value, i.action) for x, i in catalog().items()}
    assert got == TABLE


@pytest.mark.parametrize("xid", sorted(TABLE))
def test_each_row_is_derived_from_its_bucket_or_says_why_not(xid: int) -> None:
    info = catalog()[xid]
    base = derived(info.bucket)
    if xid in DEVIATIONS:
        assert base != (info.severity, info.action) and len(info.deviation) > 40, info.deviation
    else:
        assert base == (info.severity, info.action) and info.deviation == ""


def test_every_bucket_the_catalog_uses_is_mapped_and_every_mapping_used() -> None:
    used = {i.bucket for i in catalog().values() if i.bucket}
    assert used == set(BUCKETS)


@pytest.mark.parametrize("xid", range(144, 151))
def test_nvlink5_is_graded_by_the_line_and_a_nonfatal_one_never_resets(xid: int) -> None:
    fatal = classify(KIND_XID, xid, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x0)")
    nonfatal = classify(KIND_XID, xid, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008)")
    bare = classify(KIND_XID, xid, "reported by NVML")  # an NVML event: no line to grade it
    named = classify(KIND_XID, xid, "pid=1, name=Fatal, Nonfatal")  # only the word after the unit grades
    assert fatal is not None and (fatal.severity, fatal.action, fatal.sticky) == (Severity.CRITICAL, "reset_gpu", True)
    for v in (nonfatal, bare, named):
        assert v is not None and (v.severity, v.action, v.sticky) == (Severity.WARNING, "none", False)


def test_nvml_first_then_the_fatal_line_is_one_event_that_resets() -> None:
    """NVML reports 149 without its text; the kernel's line, the same event, says Fatal: the
    finding becomes critical with the reset action (and a Nonfatal line leaves it a warning)."""
    now = [1000.0]
    s = XidStream(dedupe_window=10, app_hold=300, coverage_hold=3600, overrides={},
                  subject_of=lambda pci, kind: ("gpu0", "0"), clock=lambda: now[0])  # fmt: skip
    s.add(Event("nvml", KIND_XID, 149, "0000:18:00", "reported by NVML", now[0]))
    [f] = s.findings()
    assert (f.severity, f.action) == (Severity.WARNING, "none")
    s.add(Event("kmsg", KIND_XID, 149, "0000:18:00", "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x0)", now[0]))
    [f] = s.findings()
    assert (f.severity, f.action) == (Severity.CRITICAL, "reset_gpu") and "Fatal" in f.message
    assert s.counts == {("0", "149"): 1}
    assert [x.action for x in faults(s.findings(), [])] == ["reset_gpu"]  # what the remediation ladder acts on
    now[0] += 400  # past app_xid_hold: a reset_gpu finding stays
    s.expire()
    assert [g.reason for g in s.findings()] == ["Xid149"]


def test_a_nonfatal_link_event_stays_a_warning_without_an_action_and_goes() -> None:
    now = [1000.0]
    s = XidStream(dedupe_window=10, app_hold=300, coverage_hold=3600, overrides={},
                  subject_of=lambda pci, kind: ("gpu0", "0"), clock=lambda: now[0])  # fmt: skip
    s.add(Event("kmsg", KIND_XID, 149, "0000:18:00", "NETIR Nonfatal XC0 i0 Link 04 (0x0 0x0)", now[0]))
    [f] = s.findings()
    assert (f.severity, f.action) == (Severity.WARNING, "none")
    assert faults(s.findings(), []) == []  # the remediation ladder acts on the action: never a reset
    now[0] += 301
    s.expire()
    assert s.findings() == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("xid,mnemonic,bucket,severity,action,deviation,meaning\n13,X,RESTART_APP,critical,,,m\n", "without a reason"),
        ("xid,mnemonic,bucket,severity,action,deviation,meaning\n13,X,RESTART_APP,,,because,m\n", "for no deviation"),
        ("xid,mnemonic,bucket,severity,action,deviation,meaning\n13,X,NEW_BUCKET,,,,m\n", "unknown resolution bucket"),
        ("xid,mnemonic,bucket,severity,action,deviation,meaning\n13,X,,,,,m\n", "no bucket"),
        ("xid,mnemonic,bucket,severity,action,deviation,meaning\n13,X,RESTART_APP,,wipe,why,m\n", "unknown action"),
    ],
    ids=["deviation without reason", "reason without deviation", "unknown bucket", "no bucket", "unknown action"],
)
def test_a_catalog_row_that_departs_silently_is_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_catalog(text)


def test_xid_154_from_nvml_is_graded_by_its_line() -> None:
    now = [1000.0]
    s = XidStream(dedupe_window=10, app_hold=300, coverage_hold=3600, overrides={},
                  subject_of=lambda pci, kind: ("gpu0", "0"), clock=lambda: now[0])  # fmt: skip
    s.add(Event("nvml", KIND_XID, 154, "0000:18:00", "reported by NVML", now[0]))
    assert [(f.severity, f.action) for f in s.findings()] == [(Severity.WARNING, "none")]
    line = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    s.add(Event("kmsg", KIND_XID, 154, "0000:18:00", line, now[0]))
    assert [(f.severity, f.action) for f in s.findings()] == [(Severity.CRITICAL, "reset_gpu")]


def test_a_nonfatal_link_finding_saved_by_an_older_agent_is_no_reset_after_the_upgrade() -> None:
    """An agent before this grading saved a Nonfatal 149 as a warning with reset_gpu, until reboot:
    restored, it asks for nothing and goes after app_xid_hold; a Fatal one keeps its reset."""
    now = [1000.0]
    s = XidStream(dedupe_window=10, app_hold=300, coverage_hold=3600, overrides={},
                  subject_of=lambda pci, kind: ("gpu0", "0"), clock=lambda: now[0])  # fmt: skip
    old = "Xid 149 (NVLink NETIR error (a Nonfatal line is a warning)): NETIR Nonfatal XC0 i0 Link 04 (0x0 0x0) (action: x)"
    fatal = "Xid 150 (NVLink MSE error (a Nonfatal line is a warning)): MSE Fatal XC0 i0 Link -1 (0x0 0x0) (action: x)"
    s.load_json({"active": [["gpu0", "Xid149", "warning", old, "reset_gpu", None, 1, 990.0],
                            ["gpu0", "Xid150", "critical", fatal, "reset_gpu", None, 1, 990.0]]})  # fmt: skip
    assert {f.reason: f.action for f in s.findings()} == {"Xid149": "none", "Xid150": "reset_gpu"}
    now[0] = 990.0 + 301
    s.expire()
    assert [f.reason for f in s.findings()] == ["Xid150"]
