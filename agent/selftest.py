"""`agent selftest`: every enabled check once, a table or JSON, an exit code.

Exit 0 when nothing is at warning or above, 1 otherwise. A check that could
not look (missing privilege, no such hardware) says so as an "unknown" or
"info" row; it never reports a fault it could not see.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable
from typing import TextIO

from .findings import Finding, Severity
from .store import CheckStatus, Snapshot

COLORS = {"ok": "32", "info": "36", "unknown": "35", "warning": "33", "critical": "31"}


def rows(snap: Snapshot) -> list[tuple[str, str, str, str]]:
    """(check, subject, status, detail) in check order, worst first within a check."""
    out: list[tuple[str, str, str, str]] = []
    for name, st in snap.checks.items():
        out.extend(_check_rows(name, st))
    for source, findings in snap.events.items():
        out.extend((source, f.subject, _status(f), f.message) for f in findings)
    return out


def _check_rows(name: str, st: CheckStatus) -> Iterable[tuple[str, str, str, str]]:
    by_subject: dict[str, list[Finding]] = {}
    for f in st.findings:
        by_subject.setdefault(f.subject, []).append(f)
    subjects = dict(st.observation.subjects) if st.observation else {}
    for subject in list(by_subject) + [s for s in subjects if s not in by_subject]:
        findings = sorted(by_subject.get(subject, []), key=lambda f: -f.severity.rank)
        if findings:
            for f in findings:  # under the name the daemon exports it with (an Xid: xid, not gpu)
                yield f.check, subject, _status(f), f"{f.reason}: {f.message}"
        else:
            yield name, subject, "ok", subjects.get(subject, "")
    if not by_subject and not subjects:
        yield name, "-", "ok" if st.ok else "unknown", "nothing to check here"


def _status(f: Finding) -> str:
    return "unknown" if f.unknown and f.severity is not Severity.INFO else f.severity.value


def healthy(snap: Snapshot) -> bool:
    return all(f.severity.rank < Severity.WARNING.rank for f in snap.findings())


def as_json(snap: Snapshot) -> dict[str, object]:
    checks = []
    for name, st in snap.checks.items():
        entry: dict[str, object] = {
            "name": name,
            "ok": st.ok,
            "duration_seconds": round(st.duration, 6),
            "subjects": dict(st.observation.subjects) if st.observation else {},
        }
        if st.error:
            entry["error"] = st.error.message
        checks.append(entry)
    counts = tally(rows(snap))
    return {
        "healthy": healthy(snap), "problems": counts["problems"], "unknown": counts["unknown"],
        "checks": checks, "findings": [f.as_dict() for f in snap.findings()],
    }


def tally(table: Iterable[tuple[str, str, str, str]]) -> dict[str, int]:
    """Rows at warning or critical ("problems") and rows that could not be judged ("unknown")."""
    statuses = [r[2] for r in table]
    return {
        "problems": sum(1 for s in statuses if s in ("warning", "critical")),
        "unknown": sum(1 for s in statuses if s == "unknown"),
    }


def render_table(snap: Snapshot, out: TextIO | None = None, color: bool | None = None) -> None:
    out = sys.stdout if out is None else out  # looked up per call: whatever stdout is now
    table = [("CHECK", "SUBJECT", "STATUS", "DETAIL"), *rows(snap)]
    color = out.isatty() if color is None else color
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    term = shutil.get_terminal_size((120, 24)).columns
    for i, (check, subject, status, detail) in enumerate(table):
        shown = status.upper() if i else status
        pad = shown.ljust(widths[2])
        if color and i and status in COLORS:
            pad = f"\033[{COLORS[status]}m{pad}\033[0m"
        line = f"{check.ljust(widths[0])}  {subject.ljust(widths[1])}  {pad}  {detail}"
        if color and len(line) > term:
            line = line[: term - 1] + "…"
        out.write(line.rstrip() + "\n")
    verdict = "healthy" if healthy(snap) else "NOT healthy"
    counts = tally(table[1:])
    out.write(f"\n{verdict}: {counts['problems']} problem(s), {counts['unknown']} unknown\n")


def render(snap: Snapshot, as_json_output: bool, out: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    if as_json_output:
        json.dump(as_json(snap), out, indent=2)
        out.write("\n")
    else:
        render_table(snap, out)
    return 0 if healthy(snap) else 1
