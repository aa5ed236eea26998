"""The Xid catalog kept in sync with the code, its config overrides, and the
`agent scan-log` / `agent xid` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.registry import CATALOG as AGENT_CATALOG
from agent.findings import Severity
from agent.gpu.xid_catalog import ACTIONS, RECOVERY_ACTIONS, SPECIAL_XIDS, catalog, metric_label

DMESG = b"""[    2.757687] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build
[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter
[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
"""
JOURNAL = b"""Mar 10 12:00:01 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No
Mar 10 12:00:01 gpu-node-7 systemd[1]: Started session-4.scope.
"""
KMSG = b"""6,3391,1843308145,-;NVRM: Xid (PCI:0000:3b:00): 119, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).
 SUBSYSTEM=pci
 DEVICE=+pci:0000:3b:00.0
"""


def agent(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "agent", *args], input=stdin, capture_output=True, timeout=60)


def test_every_catalog_row_is_valid() -> None:
    rows = catalog()
    assert len(rows) >= 40
    for info in rows.values():
        assert info.action in ACTIONS and isinstance(info.severity, Severity) and info.meaning
        assert metric_label(info.xid) == str(info.xid)
    assert metric_label(4242) == "other"


def test_special_xids_and_recovery_actions_are_in_the_catalog() -> None:
    assert SPECIAL_XIDS <= set(catalog())
    assert all(action in ACTIONS for _, action, _ in RECOVERY_ACTIONS.values())


def test_every_catalog_xid_has_a_declared_reason() -> None:
    reasons = AGENT_CATALOG.reasons
    for info in catalog().values():
        assert reasons[info.reason].severity is info.severity


@pytest.mark.parametrize(
    "xid", [pytest.param(x, id=f"xid {x}") for x in (13, 31, 43, 45, 68)]
)
def test_application_xids_are_not_node_faults(xid: int) -> None:
    assert catalog()[xid].severity is Severity.INFO


def test_the_catalog_ships_in_the_package() -> None:
    import agent

    assert os.path.exists(os.path.join(os.path.dirname(agent.__file__), "data", "xid_catalog.csv"))


@pytest.mark.parametrize(
    ("table", "key", "expected"),
    [
        pytest.param('"4242" = "warning"', "checks.gpu.xid_severity.4242", "expected an Xid from the catalog", id="unknown xid"),
        pytest.param('"abc" = "warning"', "checks.gpu.xid_severity.abc", "expected an Xid from the catalog", id="not a number"),
        pytest.param('"79" = "fatal"', "checks.gpu.xid_severity.79", 'expected one of "info"', id="bad severity"),
        pytest.param('"79" = 3', "checks.gpu.xid_severity.79", "expected a string", id="not a string"),
    ],
)
def test_bad_xid_override_is_one_line(tmp_path, table: str, key: str, expected: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f"[checks.gpu.xid_severity]\n{table}\n")
    res = agent("config", "check", str(path))
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert key in lines[0] and expected in lines[0]


def test_good_override_is_accepted(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[checks.gpu]\ndriver_root = "/run/nvidia/driver"\n[checks.gpu.xid_severity]\n"109" = "warning"\n')
    assert agent("config", "check", str(path)).returncode == 0


def test_library_and_driver_root_together_are_refused(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[checks.gpu]\ndriver_root = "/run/nvidia/driver"\nnvml_library = "/x/libnvidia-ml.so.1"\n')
    res = agent("config", "check", str(path))
    assert res.returncode == 2 and b"checks.gpu.driver_root" in res.stderr


def test_driver_root_list_must_be_absolute(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[checks.gpu]\ndriver_root = "/run/nvidia/driver:usr"\n')
    res = agent("config", "check", str(path))
    lines = res.stderr.decode().strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "checks.gpu.driver_root" in lines[0] and "absolute" in lines[0]
    path.write_text('[checks.gpu]\ndriver_root = "/run/nvidia/driver:/"\n')
    assert agent("config", "check", str(path)).returncode == 0


def test_driver_roots_are_tried_in_order(tmp_path) -> None:
    from agent.gpu import nvml

    for root, sub in (("operator", "usr/lib64"), ("host", "usr/lib/x86_64-linux-gnu")):
        (tmp_path / root / sub).mkdir(parents=True)
        (tmp_path / root / sub / "libnvidia-ml.so.1").write_bytes(b"")
    first, second, empty = str(tmp_path / "operator"), str(tmp_path / "host"), str(tmp_path / "none")
    assert nvml.find_library(first, second) == f"{first}/usr/lib64/libnvidia-ml.so.1"
    assert nvml.find_library(empty, second) == f"{second}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    with pytest.raises(nvml.NvmlUnavailable, match=f"under driver root {empty} or {empty}2"):
        nvml.find_library(empty, empty + "2")


@pytest.mark.parametrize(
    ("data", "expected", "rc"),
    [
        pytest.param(DMESG, [(13, "0000:cb:00", "info", "restart_app"), (79, "0000:3b:00", "critical", "reboot")], 1, id="dmesg"),
        pytest.param(JOURNAL, [(94, "0000:3b:00", "warning", "restart_app")], 0, id="journalctl -k"),
        pytest.param(KMSG, [(119, "0000:3b:00", "critical", "reset_gpu")], 1, id="raw kmsg records"),
        pytest.param(b"no nvidia here\n", [], 0, id="nothing"),
    ],
)
def test_scan_log_json(tmp_path, data: bytes, expected: list[tuple[object, ...]], rc: int) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(data)
    res = agent("scan-log", str(path), "--json")
    assert res.returncode == rc, res.stderr
    events = json.loads(res.stdout)
    assert [(e["xid"], e["pci"], e["severity"], e["action"]) for e in events] == expected
    assert all(isinstance(e["xid"], int) and e["message"] for e in events)


def test_scan_log_skips_kmsg_records_a_process_wrote() -> None:
    """The same NVRM line: from the kernel (facility 0) an event, from a process
    (``12,`` user.warning, ``<30>`` daemon) not; dmesg text states no facility."""
    forged = KMSG.replace(b"6,3391,", b"12,3392,", 1) + b"<30>NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    res = agent("scan-log", "-", "--json", stdin=KMSG + forged + DMESG)
    assert res.returncode == 1, res.stderr
    events = json.loads(res.stdout)
    assert [(e["line"], e["xid"]) for e in events] == [(1, 119), (9, 13), (10, 79)]
    assert res.stderr.decode() == (
        "2 NVIDIA lines written by processes (syslog facility not kern), not by the kernel, are not events: line 4, 7\n"
    )
    alone = agent("scan-log", "-", stdin=forged)
    assert alone.returncode == 0 and alone.stdout.decode().endswith("0 events, 0 critical\n")


def test_scan_log_reads_stdin_and_prints_a_table() -> None:
    res = agent("scan-log", "-", stdin=DMESG)
    out = res.stdout.decode()
    assert res.returncode == 1
    assert "CRITICAL Xid 79" in out and "drain the node and reboot it" in out and "2 events, 1 critical" in out


def test_scan_log_unreadable_file_is_exit_2(tmp_path) -> None:
    res = agent("scan-log", str(tmp_path / "missing.log"))
    assert res.returncode == 2 and len(res.stderr.decode().strip().splitlines()) == 1


def test_xid_explains_one() -> None:
    res = agent("xid", "79")
    assert res.returncode == 0
    assert b"ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in res.stdout and b"reboot" in res.stdout


@pytest.mark.parametrize("arg", ["4242", "abc"])
def test_xid_unknown_is_exit_2(arg: str) -> None:
    res = agent("xid", arg)
    assert res.returncode == 2
    assert len(res.stderr.decode().strip().splitlines()) == 1 and b"Traceback" not in res.stderr


def test_the_documented_hold_of_each_action_is_what_the_verdicts_do() -> None:
    """docs/gpu.md's action table says how long a finding stays (`xids.hold`): a catalog Xid's
    verdict is sticky (until reboot) exactly where the table says so."""
    from agent.gpu.xid_catalog import classify, hold
    from agent.parsers.xid import KIND_XID

    for xid, info in catalog().items():
        if xid in (154, *range(144, 151)):  # their verdict follows the line (recovery action, Fatal/Nonfatal)
            continue
        verdict = classify(KIND_XID, xid, info.meaning)
        assert verdict is not None and verdict.action == info.action
        assert verdict.sticky == hold(info.action).startswith("until the node reboots"), xid
