"""`agent scan-log [FILE|-] [--json] [--config FILE]` and `agent xid N`.

scan-log reads a saved kernel log (``dmesg`` with or without timestamps,
``dmesg -T``/``-x``/``-r``/``--time-format iso``, ``journalctl -k`` in its short
formats, ``/var/log/kern.log`` and syslog files, raw ``/dev/kmsg`` records) and lists every
NVIDIA event in it and every kernel fault of the fault table
(`agent.kernel.catalog.PATTERNS`, with the changes of ``--config``'s
``[checks.kernel]``), with its meaning and recommended action: a post-mortem
of a dead node's journal. A line that states a syslog facility other than the
kernel's (a raw ``/dev/kmsg`` record ``12,…;`` or a ``<12>`` prefix: a
process wrote it) is no event, as in the daemon; they are counted on standard
error. Exit 0 when nothing is critical, 1 when something is, 2 when the file
(or the config) cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..findings import ACTION_TEXT, Severity
from ..gpu.xid_catalog import BUCKETS, classify, lookup
from ..kernel.patterns import DEFAULT, Table, scan_log
from ..parsers.xid import KIND_DRIVER_LOADED
from .shared import UsageError

MAX_INPUT = 1 << 30


def register(sub: Any) -> None:
    scan = sub.add_parser(
        "scan-log",
        help="list the Xid/NVRM events and kernel faults in a saved kernel log (dmesg, journalctl -k, /dev/kmsg records)",
        description="Exit 0: nothing critical; 1: a critical event; 2: the file cannot be read.",
    )
    scan.add_argument("file", nargs="?", default="-", metavar="FILE|-", help="the log file; - or nothing: standard input")
    scan.add_argument("--json", action="store_true", help="a JSON list of events")
    scan.add_argument("--config", metavar="FILE", help="take the kernel fault table's changes from this config ([checks.kernel])")
    scan.add_argument(
        "--patterns", metavar="FILE",
        help="add node-problem-detector's kernel-monitor rules (its kernel-monitor.json) after the table's patterns",
    )
    scan.add_argument(
        "--to-toml", action="store_true",
        help="print the --patterns rules as [checks.kernel.patterns.<name>] tables to paste into the config, and scan nothing",
    )
    scan.set_defaults(func=cmd_scan_log)
    xid = sub.add_parser("xid", help="explain one Xid: meaning, severity, recommended action")
    xid.add_argument("number", metavar="N")
    xid.set_defaults(func=cmd_xid)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read(MAX_INPUT)
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_INPUT)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def scan(data: bytes, not_kernel: list[int] | None = None) -> list[dict[str, Any]]:
    """The events of a log, as the JSON objects `scan-log --json` prints; the
    line numbers of events in lines a process wrote go to `not_kernel`."""
    from .. import native

    out = []
    for r in native.parse_xid(data):
        if not r.from_kernel:
            if not_kernel is not None:
                not_kernel.append(r.line + 1)
            continue
        if r.kind == KIND_DRIVER_LOADED:
            continue
        v = classify(r.kind, r.xid, r.message)
        if v is None:  # pragma: no cover - every other kind has a verdict
            continue
        info = lookup(v.xid) if r.kind_name in ("xid", "fallen-off-bus") else None
        out.append({
            "line": r.line + 1,
            "time": r.time,
            "kind": r.kind_name,
            "xid": v.xid,
            "pci": r.pci,
            "mig": r.mig,
            "pid": r.pid,
            "name": r.name,
            "severity": v.severity.value,
            "action": v.action,
            "reason": v.reason,
            "mnemonic": info.mnemonic if info else "",
            "meaning": v.title,
            "message": r.message,
            "caused_by": r.caused_by or None,
        })
    return out


def kernel_faults(data: bytes, table: Table, not_kernel: list[int] | None = None) -> list[dict[str, Any]]:
    """The kernel faults of a log, as the JSON objects `scan-log --json` prints (kind "kernel")."""
    return [
        {"line": line, "time": time, "kind": "kernel", "fault": p.name, "severity": p.severity.value,
         "action": p.action, "reason": p.reason, "meaning": table.catalog.reason(p.reason).summary if p.summary == "" else p.summary,
         "message": message.decode("utf-8", "replace")}
        for line, time, p, message in scan_log(data, table, not_kernel)
    ]


def _table(config: str | None) -> Table:
    if config is None:
        return DEFAULT
    from ..config import load
    from ..kernel.settings import KernelConfig
    from ..schema import ConfigError

    try:
        cfg = load(config).checks["kernel"]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    assert isinstance(cfg, KernelConfig)
    return cfg.table()  # validated when the file was loaded


def cmd_scan_log(args: argparse.Namespace) -> int:
    if args.to_toml:
        from ..kernel.npd import NpdError, to_toml

        if not args.patterns:
            raise UsageError("--to-toml: expected --patterns FILE (the kernel-monitor.json to convert)")
        try:
            sys.stdout.write(to_toml(_read(args.patterns)))
        except NpdError as exc:
            raise UsageError(f"{args.patterns}: {exc}") from None
        return 0
    table = _table(args.config)
    if args.patterns:
        from ..kernel.npd import NpdError, with_rules

        try:
            table = with_rules(table, _read(args.patterns))
        except NpdError as exc:
            raise UsageError(f"{args.patterns}: {exc}") from None
    data = _read(args.file)
    not_kernel: list[int] = []
    events = scan(data, not_kernel)
    faults_not_kernel: list[int] = []
    events = sorted(events + kernel_faults(data, table, faults_not_kernel), key=lambda e: e["line"])
    for lines, what in ((not_kernel, "NVIDIA lines"), (faults_not_kernel, "kernel-fault lines")):
        if lines:
            shown = ", ".join(map(str, lines[:10])) + (", …" if len(lines) > 10 else "")
            sys.stderr.write(
                f"{len(lines)} {what} written by processes (syslog facility not kern), not by the kernel, "
                f"are not events: line {shown}\n"
            )
    if args.json:
        json.dump(events, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for e in events:
            when = f"[{e['time']}] " if e["time"] else ""
            if e["kind"] == "kernel":
                what = f"kernel fault {e['fault']} ({e['reason']})"
            else:
                what = e["meaning"] + (f" {e['pci']}" if e["pci"] else " (unknown GPU: no address in the line)" if e["kind"] == "xid" else "")
            sys.stdout.write(
                f"{e['line']}: {when}{e['severity'].upper()} {what}: {e['message']}\n"
                f"    action: {ACTION_TEXT[e['action']]}\n"
            )
        crit = sum(1 for e in events if e["severity"] == "critical")
        sys.stdout.write(f"{len(events)} events, {crit} critical\n")
    return 1 if any(e["severity"] == Severity.CRITICAL.value for e in events) else 0


def cmd_xid(args: argparse.Namespace) -> int:
    if not args.number.isdigit():
        raise UsageError(f'expected an Xid number, got "{args.number}"')
    info = lookup(int(args.number))
    if info is None:
        raise UsageError(
            f"Xid {int(args.number)} is not in the catalog; see "
            "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
        )
    print(f"Xid {info.xid} {info.mnemonic}".rstrip())
    print(f"  meaning:  {info.meaning}")
    app = info.bucket in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45")
    print(f"  severity: {info.severity.value}{' (an application error, not a node fault)' if app else ''}")
    print(f"  action:   {info.action}: {ACTION_TEXT[info.action]}")
    print(f"  NVIDIA resolution bucket: {info.bucket or '(none given)'}")
    why = f"deviation: {info.deviation}" if info.deviation else BUCKETS[info.bucket][2]
    print(f"  why:      {why}")
    stays = "until reboot" if info.action not in ("none", "restart_app") else "held for checks.gpu.app_xid_hold"
    if info.bucket in ("WORKFLOW_NVLINK5_ERR", "XID_154"):
        stays = "as the action the event grades: until reboot for a reset or reboot, else held for checks.gpu.app_xid_hold"
    print(f"  finding:  {info.reason}, {stays}")
    return 0
