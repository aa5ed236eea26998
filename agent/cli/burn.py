"""`agent burn`: burn the GPUs now and print what was found.

Exit 0 when every GPU passed (or there is no GPU), 1 when a GPU failed or
could not be tested, 2 on bad input (`--gpus 9` on a one-GPU host,
`--seconds 0`). It does not touch the daemon's state: the preflight result of
this boot stays what it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, TextIO

from ..burn.model import BurnReport, GpuVerdict
from .shared import UsageError, common_flags, overrides


def register(sub: Any) -> None:
    p = sub.add_parser(
        "burn",
        help="burn the GPUs now and print the result (exit 0 pass, 1 fail)",
        description="Stress every GPU (GEMM on the tensor cores, memory pattern test) in parallel, "
        "verify the results, compare the GPUs, watch NVML; print one line per GPU.",
    )
    common_flags(p)
    p.add_argument(
        "--seconds", type=float, metavar="N", help="burn each GPU for N seconds (default: checks.burn.duration)"
    )
    p.add_argument("--gpus", metavar="0,1,…", help="only these GPU indices (as nvidia-smi numbers them)")
    p.add_argument("--backend", choices=("auto", "builtin", "dcgm"), help="override checks.burn.backend")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=cmd_burn)


def parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    out = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise UsageError(f'--gpus: expected GPU indices such as "0,1,3", got "{text}"')
        out.append(int(part))
    return out


def check_seconds(seconds: float | None, flag: str) -> None:
    if seconds is not None and not seconds > 0:
        raise UsageError(f"{flag}: expected a number of seconds above 0, got {seconds:g}")


def burn(cfg: Any, seconds: float | None, gpus: list[int] | None, backend: str | None = None) -> BurnReport:
    from ..burn.settings import runner as make_runner
    from ..runtime import host_paths

    bcfg = cfg.checks["burn"]
    if backend:
        bcfg = dataclasses.replace(bcfg, backend=backend)
    runner = make_runner(host_paths(cfg), bcfg, cfg.checks["gpu"])
    found = runner.discover()
    present = [g.index for g in found.gpus]
    for i in gpus or ():
        if i not in present:
            have = ", ".join(map(str, present)) or "none"
            raise UsageError(f"--gpus: there is no GPU {i} here (GPUs: {have})")
    return runner.burn(found, gpus, seconds=seconds)


def cmd_burn(args: argparse.Namespace) -> int:
    from .. import logs
    from ..runtime import load_config

    cfg = load_config(overrides(args))
    logs.setup(args.log_level or "warning", cfg.agent.log_format)
    check_seconds(args.seconds, "--seconds")
    report = burn(cfg, args.seconds, parse_gpus(args.gpus), args.backend)
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(report, sys.stdout)
    return 0 if report.status == "pass" else 1


def selftest_burn(cfg: Any, store: Any, seconds: float) -> None:
    """`agent selftest --burn SECONDS`: the burn's findings join the table."""
    from ..burn.publish import findings, samples

    check_seconds(seconds, "--burn")
    report = burn(cfg, seconds, None)
    store.set_events("burn", findings(report, "manual"), samples(report, "disabled", {}))


def _fmt(value: float | None, unit: float) -> str:
    return f"{value / unit:.1f}" if value is not None else "-"


def _detail(g: GpuVerdict) -> str:
    parts = [f"{p.fault.value}: {p.message}" for p in g.problems] + list(g.notes)
    return "; ".join(parts)


def render(report: BurnReport, out: TextIO) -> None:
    head = ("GPU", "MODEL", "RESULT", "TFLOP/S", "MEM GB/S", "POWER W", "SM MHZ", "MAX C", "ERRORS")
    rows = [(*head, "DETAIL")]
    for g in report.gpus:
        t = g.telemetry
        rows.append(
            (
                str(g.index),
                g.name or "-",
                g.status.upper(),
                _fmt(g.gemm_flops, 1e12),
                _fmt(g.memory_bandwidth, 1e9),
                _fmt(t.power_watts_mean, 1),
                _fmt(t.sm_clock_hz_mean, 1e6).removesuffix(".0"),
                _fmt(t.temperature_max_c, 1),
                str(g.compute_errors + g.memory_errors),
                _detail(g),
            )
        )
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        out.writelines("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] + "\n" for r in rows)
        out.write("\n")
    why = report.error or report.unavailable or report.note
    out.write(f"burn: {report.status} ({report.backend}, {report.duration:.0f}s)" + (f": {why}" if why else "") + "\n")
