"""The DCGM backend: `dcgmi diag -r LEVEL -j` where DCGM is installed.

The JSON changed between DCGM 3 and 4 and this parser takes both:

- 3.x: root "DCGM GPU Diagnostic"; a result names its GPU with "gpu_id" or
  "gpu_ids" (a string, a comma-separated list for the software tests);
  "warnings" and "info" are strings or lists of strings;
- 4.x: root "DCGM Diagnostic"; a result names an entity ("entity_group":
  "GPU", "entity_id": 0) and its warnings are objects with "warning",
  "error_id" and "error_severity"; a test has a "test_summary"; a failure of
  the whole run is "runtime_error". Schema: NVIDIA/DCGM
  testing/python3/dcgm_diag_schema.json; release notes: "DCGM 4.x changed the
  JSON output format" (https://github.com/facebookresearch/gcm/pull/38).

A GPU fails when one of its results is "Fail" with a warning that is not of
severity DCGM_ERROR_CONFIG (5: "can be configured", e.g. persistence mode
off — a node setting, not a sick GPU; dcgm_errors.h). dcgmi's exit status is
not used: it is non-zero whenever a test fails. DCGM GPU ids are taken to be
NVML indices, which they are on a host where DCGM sees every GPU.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .backend import BackendError
from .model import BurnPlan, Fault, GpuInfo, GpuOutcome, Problem
from .proc import Process

OUTPUT_LIMIT = 8 << 20
SEVERITY_CONFIG = 5
RAN = ("pass", "fail", "warn")


@dataclass
class _Gpu:
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ran: bool = False
    skipped: list[str] = field(default_factory=list)


def _root(doc: Any) -> Mapping[str, Any]:
    if isinstance(doc, dict):
        for key in ("DCGM Diagnostic", "DCGM GPU Diagnostic"):
            if isinstance(doc.get(key), dict):
                return doc[key]  # type: ignore[no-any-return]
    raise ValueError('not a dcgmi diag JSON document (no "DCGM Diagnostic" or "DCGM GPU Diagnostic")')


def _gpu_ids(result: Mapping[str, Any]) -> list[int]:
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        return [int(result["entity_id"])] if group == "GPU" and isinstance(result["entity_id"], int) else []
    raw = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(raw, int):
        return [raw]
    if isinstance(raw, str):
        return [int(p) for p in raw.split(",") if p.strip().isdigit()]
    return []


def _warnings(result: Mapping[str, Any]) -> list[tuple[str, int | None]]:
    """(text, severity) of each warning; severity None where DCGM 3 gives only text."""
    raw = result.get("warnings")
    items = raw if isinstance(raw, list) else [raw] if raw else []
    out = []
    for w in items:
        if isinstance(w, dict):
            sev = w.get("error_severity")
            out.append((str(w.get("warning", "")).strip(), sev if isinstance(sev, int) else None))
        else:
            out.append((str(w).strip(), None))
    return out


def _apply(gpu: _Gpu, test: str, result: Mapping[str, Any]) -> None:
    status = str(result.get("status", "")).strip().lower()
    warnings = _warnings(result)
    if status in RAN:
        gpu.ran = True
    if status == "fail":
        hard = [w for w, sev in warnings if sev != SEVERITY_CONFIG] or ([] if warnings else ["failed"])
        if hard:
            gpu.problems.append(Problem(Fault.DIAG_FAILED, f"DCGM {test}: " + "; ".join(hard)))
        else:
            gpu.notes.append(f"DCGM {test}: configuration: " + "; ".join(w for w, _ in warnings))
    elif status == "warn":
        gpu.notes.append(f"DCGM {test}: warning: " + ("; ".join(w for w, _ in warnings) or "(no text)"))
    elif status in ("skip", "skipped", "not run", "notrun"):
        gpu.skipped.append(test)


def parse_diag(text: str) -> dict[int, GpuOutcome]:
    """Outcomes per DCGM GPU id from `dcgmi diag -j` output. Raises ValueError."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in the dcgmi output")
    root = _root(json.loads(text[start:]))
    if root.get("runtime_error"):
        raise ValueError(f"DCGM runtime error: {root['runtime_error']}")
    gpus: dict[int, _Gpu] = {}
    for category in root.get("test_categories") or ():
        for test in (category or {}).get("tests") or ():
            name = str(test.get("name", "?"))
            for result in test.get("results") or ():
                for i in _gpu_ids(result):
                    _apply(gpus.setdefault(i, _Gpu()), name, result)
    return {i: _outcome(i, g) for i, g in gpus.items()}


def _outcome(index: int, g: _Gpu) -> GpuOutcome:
    notes = list(g.notes)
    if g.skipped:
        notes.append("DCGM skipped: " + ", ".join(g.skipped))
    return GpuOutcome(index, problems=tuple(g.problems), notes=tuple(notes), ran=g.ran or bool(g.problems))


class DcgmJob:
    def __init__(self, argv: Sequence[str], gpus: Sequence[int]) -> None:
        self.gpus: tuple[int, ...] = tuple(gpus)
        self._out: list[bytes] = []
        self._size = 0
        self.process = Process(argv, None, self._line)

    def _line(self, raw: bytes) -> None:
        if self._size < OUTPUT_LIMIT:
            self._out.append(raw)
            self._size += len(raw)

    def phase(self) -> str:
        return "dcgmi diag"

    def kill(self) -> None:
        self.process.kill()

    def poll(self) -> Mapping[int, GpuOutcome] | None:
        code = self.process.returncode()
        if code is None:
            return None
        text = b"".join(self._out).decode("utf-8", "replace")
        try:
            return parse_diag(text)
        except ValueError as exc:
            said = " | ".join(x for x in (text.strip()[:300], self.process.stderr_tail()) if x)
            why = f"dcgmi {self.process.how_it_ended(code)}; {exc}" + (f": {said}" if said else "")
            return {i: GpuOutcome(i, ran=False, notes=(why,)) for i in self.gpus}


class DcgmBackend:
    name = "dcgm"

    def __init__(self, *, level: int = 2, timeout: float = 1200.0, dcgmi: str = "dcgmi") -> None:
        self.level, self.timeout, self.dcgmi = level, timeout, dcgmi

    def unavailable(self) -> str | None:
        return None if shutil.which(self.dcgmi) else f"{self.dcgmi} is not installed (DCGM)"

    def time_limit(self, plan: BurnPlan) -> float:
        return self.timeout

    def discover(self) -> list[GpuInfo]:
        raise BackendError("DCGM cannot list GPUs without NVML")

    def start(self, gpus: Sequence[GpuInfo], plan: BurnPlan) -> list[DcgmJob]:
        exe = shutil.which(self.dcgmi)
        if exe is None:
            raise BackendError(f"{self.dcgmi} is not installed")
        ids = [g.index for g in gpus]
        argv = [exe, "diag", "-r", str(self.level), "-j", "-i", ",".join(map(str, ids))]
        try:
            return [DcgmJob(argv, ids)]
        except OSError as exc:
            raise BackendError(f"cannot start {exe}: {exc.strerror}") from None
