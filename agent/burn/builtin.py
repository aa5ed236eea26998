"""The built-in backend: one `agent.burn.worker` process per GPU.

Each worker gets its GPU through CUDA_VISIBLE_DEVICES (the UUID from NVML,
else the index with CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA counts like
nvidia-smi), its own session (so a kill reaches everything it started), and
is read line by line by a reader thread. Nothing here blocks on a worker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from . import cublas
from .backend import BackendError
from .model import BurnPlan, Fault, GpuInfo, GpuOutcome, Problem
from .proc import Process


def worker_command() -> list[str]:
    return [sys.executable, "-m", "agent.burn.worker"]


class WorkerJob:
    def __init__(self, gpu: GpuInfo, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.gpus: tuple[int, ...] = (gpu.index,)
        self.index = gpu.index
        self._phase = "starting"
        self._final: dict[str, Any] | None = None
        self.process = Process(argv, env, self._line)

    def _line(self, raw: bytes) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "phase":
            self._phase = str(event.get("phase", "?"))
        elif kind in ("result", "unavailable", "error"):
            self._final = event

    def phase(self) -> str:
        return self._phase

    def poll(self) -> Mapping[int, GpuOutcome] | None:
        code = self.process.returncode()
        return None if code is None else {self.index: self._outcome(code)}

    def kill(self) -> None:
        self.process.kill()

    def _outcome(self, code: int) -> GpuOutcome:
        ev = self._final
        if ev is None:
            tail = self.process.stderr_tail()
            msg = f"the burn worker {self.process.how_it_ended(code)} during {self._phase}" + (
                f": {tail}" if tail else ""
            )
            return GpuOutcome(self.index, problems=(Problem(Fault.CUDA_ERROR, msg),))
        if ev["event"] != "result":
            return GpuOutcome(self.index, ran=False, notes=(f"not tested: {ev.get('message', '')}",))
        return outcome_from_event(self.index, ev)


def outcome_from_event(index: int, ev: Mapping[str, Any]) -> GpuOutcome:
    problems = []
    for p in ev.get("problems", ()):
        try:
            problems.append(Problem(Fault(p["fault"]), str(p["message"])))
        except (KeyError, ValueError, TypeError):
            problems.append(Problem(Fault.CUDA_ERROR, f"unreadable problem from the worker: {p!r}"))

    def num(key: str) -> float | None:
        v = ev.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return GpuOutcome(
        index=index,
        gemm_flops=num("gemm_flops"),
        memory_bandwidth=num("memory_bandwidth"),
        iterations=int(num("iterations") or 0),
        compute_errors=int(num("compute_errors") or 0),
        memory_errors=int(num("memory_errors") or 0),
        digest=str(ev.get("digest") or ""),
        group=str(ev.get("group") or ""),
        duration=num("duration") or 0.0,
        problems=tuple(problems),
        notes=tuple(str(n) for n in ev.get("notes", ())),
    )


class BuiltinBackend:
    name = "builtin"

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command or worker_command())

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
            return "cuda-bindings is not installed (pip install node-health-agent[gpu])"
        if not cublas.installed():
            return "cuBLAS is not installed (pip install node-health-agent[gpu])"
        return None

    def time_limit(self, plan: BurnPlan) -> float:
        return plan.seconds + plan.hang_timeout

    def _env(self, gpu: GpuInfo | None) -> dict[str, str]:
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu.uuid or str(gpu.index)
        return env

    def start(self, gpus: Sequence[GpuInfo], plan: BurnPlan) -> list[WorkerJob]:
        args = [
            "--parent-pid",
            str(os.getpid()),
            "run",
            "--seconds",
            str(plan.seconds),
            "--matrix-size",
            str(plan.matrix_size),
            "--memory-fraction",
            str(plan.memory_fraction),
            "--memory-time-share",
            str(plan.memory_time_share),
        ]
        jobs: list[WorkerJob] = []
        try:
            for g in gpus:
                jobs.append(WorkerJob(g, self.command + args, self._env(g)))
        except OSError as exc:
            for job in jobs:
                job.kill()
            raise BackendError(f"cannot start the burn worker {self.command[0]}: {exc.strerror}") from None
        return jobs

    def discover(self) -> list[GpuInfo]:
        try:
            res = subprocess.run(
                [*self.command, "list"],
                env=self._env(None),
                capture_output=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"listing the GPUs with CUDA failed: {exc}") from None
        for line in res.stdout.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "devices":
                return [GpuInfo(index=d["index"], name=d["name"], pci_bus_id=d["pci_bus_id"]) for d in ev["devices"]]
            if ev.get("event") == "unavailable":
                raise BackendError(ev.get("message", "CUDA is not available"))
        raise BackendError(f"listing the GPUs with CUDA failed (exit {res.returncode})")
