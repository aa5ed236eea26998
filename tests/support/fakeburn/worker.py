"""A stand-in for `python -m agent.burn.worker` that speaks its protocol
(JSON lines, the same arguments) without a GPU. What each GPU does comes
from $FAKE_BURN, a JSON object keyed by the CUDA_VISIBLE_DEVICES value the
agent gave the worker:

    pass | slow | mismatch | digest | memory | hang | crash | unavailable | garbage

$FAKE_BURN_PIDS, when set, is a directory where each worker writes its pid.
It installs the real worker's parent-death signal, so tests can check that a
dying agent takes its workers with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from agent.burn.worker import die_with_parent, emit


def result(args: argparse.Namespace, **over: object) -> dict[str, object]:
    ev: dict[str, object] = {
        "event": "result",
        "gemm_flops": 700e12,
        "memory_bandwidth": 2.9e12,
        "iterations": 100,
        "compute_errors": 0,
        "memory_errors": 0,
        "digest": "00c0ffee00c0ffee",
        "group": f"NVIDIA H100 80GB HBM3|132|{args.matrix_size}",
        "notes": ["memory test: 60.0 GiB, 4 passes"],
        "problems": [],
        "duration": args.seconds,
    }
    return ev | over


def run(args: argparse.Namespace, what: str) -> int:
    emit({"event": "phase", "phase": "gemm"})
    if what == "hang":
        emit({"event": "phase", "phase": "gemm"})
        while True:
            time.sleep(3600)
    if what == "crash":
        sys.stderr.write("Fatal Python error: Segmentation fault\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "unavailable":
        emit({"event": "unavailable", "message": "a CUDA library cannot be loaded: libcuda.so.1"})
        return 3
    if what == "garbage":
        print("not json {", flush=True)
        return 0
    time.sleep(min(args.seconds, 0.2))
    emit({"event": "phase", "phase": "memory"})
    if what == "slow":
        emit(result(args, gemm_flops=350e12))
    elif what == "digest":
        emit(result(args, digest="0badd16e570badd1"))
    elif what == "mismatch":
        emit(
            result(
                args,
                compute_errors=3,
                problems=[
                    {
                        "fault": "compute_mismatch",
                        "message": "3 of 100 GEMM iterations gave a result that differs from the first one, "
                        "with the same inputs",
                    }
                ],
            )
        )
    elif what == "memory":
        emit(
            result(args, memory_errors=17, problems=[{"fault": "memory_errors", "message": "17 words read back wrong"}])
        )
    else:
        emit(result(args))
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--parent-pid", type=int, default=0)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    for flag in ("--seconds", "--matrix-size", "--memory-fraction", "--memory-time-share"):
        r.add_argument(flag, type=float, required=True)
    sub.add_parser("list")
    args = p.parse_args()
    die_with_parent(args.parent_pid)
    scenario = json.loads(os.environ.get("FAKE_BURN", "{}"))
    if args.command == "list":
        n = int(scenario.get("count", 0))
        emit(
            {
                "event": "devices",
                "devices": [
                    {"index": i, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"0000:{0x18 + i:02X}:00.0"}
                    for i in range(n)
                ],
            }
        )
        return 0
    key = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if os.environ.get("FAKE_BURN_PIDS"):
        with open(os.path.join(os.environ["FAKE_BURN_PIDS"], f"{key}.pid"), "w") as fh:
            fh.write(str(os.getpid()))
    return run(args, scenario.get(key, "pass"))


if __name__ == "__main__":
    sys.exit(main())
