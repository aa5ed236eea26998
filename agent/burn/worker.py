"""`python -m agent.burn.worker`: the process that burns one GPU.

The agent starts one per GPU, with CUDA_VISIBLE_DEVICES set to that GPU, and
kills it at its deadline: CUDA never runs inside the agent, and a GPU that
hangs takes only its own worker with it. Output is JSON lines on stdout:

    {"event": "phase", "phase": "gemm"}            where it is (heartbeat)
    {"event": "progress", ...}                     counters while it runs
    {"event": "result", ...}                       measurements and problems
    {"event": "unavailable", "message": ...}       cannot run here (no driver,
                                                   no cuda-bindings, no cuBLAS)

`list` prints the CUDA devices in PCI bus order (used when NVML is missing).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from .model import Fault


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def die_with_parent(parent: int) -> None:
    # PR_SET_PDEATHSIG: the kernel SIGKILLs this worker when the agent thread
    # that forked it exits, so an agent that crashes mid-burn leaves no GPU
    # burning (https://man7.org/linux/man-pages/man2/prctl.2.html). The
    # getppid check closes the race with a parent that died before the call.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:
        os._exit(1)


def _unavailable_reason(exc: BaseException) -> str | None:
    """The message when `exc` means "cannot run here" rather than "the GPU failed"."""
    from .cublas import CublasError

    if isinstance(exc, ImportError):
        return f"cuda-bindings is not installed ({exc}); install node-health-agent[gpu]"
    if isinstance(exc, CublasError):
        return str(exc)
    if type(exc).__name__ in ("DynamicLibNotFoundError", "DynamicLibNotAvailableError"):
        return f"a CUDA library cannot be loaded: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    from .cublas import Cublas
    from .cuda import CudaError, Device
    from .gpuburn import Burn

    t0 = time.monotonic()
    problems: list[dict[str, str]] = []
    burn = None
    try:
        dev = Device(0)
        burn = Burn(dev, Cublas(dev.stream_handle()), emit)
        group = f"{dev.name()}|{dev.attribute('MULTIPROCESSOR_COUNT')}|{args.matrix_size}"
        burn.gemm(args.matrix_size, args.seconds * (1 - args.memory_time_share))
        burn.memory(args.memory_fraction, args.seconds * args.memory_time_share)
    except CudaError as exc:
        phase = burn.phase if burn else "setup"
        problems.append({"fault": Fault.CUDA_ERROR.value, "message": f"{exc} (in the {phase} phase)"})
        group = ""
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        reason = _unavailable_reason(exc)
        emit({"event": "unavailable" if reason else "error", "message": reason or f"{type(exc).__name__}: {exc}"})
        return 3
    result = burn.result if burn else None
    emit(_result_event(result, group, problems, time.monotonic() - t0))
    return 0


def _result_event(r: Any, group: str, problems: list[dict[str, str]], duration: float) -> dict[str, Any]:
    event: dict[str, Any] = {"event": "result", "duration": duration, "group": group}
    if r is None:
        return event | {"problems": problems}
    if r.compute_errors:
        problems.append(
            {
                "fault": Fault.COMPUTE_MISMATCH.value,
                "message": f"{r.compute_errors} of {r.iterations} GEMM iterations gave a result that differs "
                "from the first one, with the same inputs",
            }
        )
    if r.nonfinite:
        problems.append(
            {
                "fault": Fault.COMPUTE_MISMATCH.value,
                "message": f"{r.nonfinite} NaN/Inf values in GEMM results from finite inputs",
            }
        )
    if r.reference_errors:
        from .gpuburn import SAMPLES

        more = len(r.reference_errors) - 1
        problems.append(
            {
                "fault": Fault.COMPUTE_MISMATCH.value,
                "message": f"{len(r.reference_errors)} of {SAMPLES} sampled GEMM results differ from the host's "
                f"reference: {r.reference_errors[0]}" + (f" (and {more} more)" if more else ""),
            }
        )
    if r.memory_errors:
        problems.append(
            {
                "fault": Fault.MEMORY_ERRORS.value,
                "message": f"{r.memory_errors} 64-bit words read back wrong in the memory pattern test "
                f"(first at byte offset {8 * (r.first_bad_word or 0):#x} of the tested range)",
            }
        )
    return event | {
        "gemm_flops": r.gemm_flops,
        "memory_bandwidth": r.memory_bandwidth,
        "iterations": r.iterations,
        "compute_errors": r.compute_errors + r.nonfinite + len(r.reference_errors),
        "memory_errors": r.memory_errors,
        "digest": r.digest,
        "notes": r.notes,
        "problems": problems,
    }


def list_devices() -> int:
    try:
        from cuda.bindings import driver as cu  # type: ignore[import-untyped]

        from .cuda import CudaError

        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise CudaError("cuInit", str(err))
        _, count = cu.cuDeviceGetCount()
        devices = []
        for i in range(count):
            _, dev = cu.cuDeviceGet(i)
            _, name = cu.cuDeviceGetName(256, dev)
            _, bus = cu.cuDeviceGetPCIBusId(32, dev)
            devices.append({"index": i, "name": bytes(name).split(b"\0")[0].decode(), "pci_bus_id": _text(bus)})
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        emit({"event": "unavailable", "message": _unavailable_reason(exc) or f"{type(exc).__name__}: {exc}"})
        return 3
    emit({"event": "devices", "devices": devices})
    return 0


def _text(raw: Any) -> str:
    return raw if isinstance(raw, str) else bytes(raw).split(b"\0")[0].decode()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agent.burn.worker")
    p.add_argument("--parent-pid", type=int, default=0)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--matrix-size", type=int, required=True)
    r.add_argument("--memory-fraction", type=float, required=True)
    r.add_argument("--memory-time-share", type=float, required=True)
    sub.add_parser("list")
    args = p.parse_args(argv)
    die_with_parent(args.parent_pid)
    return run(args) if args.command == "run" else list_devices()


if __name__ == "__main__":
    sys.exit(main())
