"""The GPU telemetry engine: `TelemetryPoller` reads every GPU's power, energy,
clocks, utilisation, framebuffer, PCIe and NVLink traffic, throttle time and
(Hopper and later) GPM profiling ratios, for `/metrics`.

It runs as its own check (``gpu_telemetry``), on its own interval (10 s by
default) beside the GPU health check (30 s): the scheduler runs it in a thread
of its own and the store keeps its last observation, which is all a scrape
renders, so a scrape never waits on NVML. Every GPU is read in its own probe
thread (`Prober`) with ``call_timeout``: a GPU whose NVML calls hang has no
telemetry (``node_health_gpu_telemetry_up`` 0, ``NvmlCallHung``) and is not
asked again until the stuck call returns; the other GPUs are still read and
the poll still finishes. It judges nothing: health is the GPU check's.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from ..findings import Observation, ObservationBuilder
from ..hostpaths import HostPaths
from ..probe import Prober
from . import nvml
from .gpm import GpmSampler
from .settings import GpuConfig, TelemetryConfig, nvml_library
from .telemetry_read import GpuLost, Telemetry, TelemetryReader

log = logging.getLogger(__name__)


class TelemetryPoller:
    """Polls every GPU on each `poll`; keeps the reader (per-GPU discoveries) and the GPM buffers."""

    def __init__(self, paths: HostPaths, cfg: TelemetryConfig, gpu: GpuConfig) -> None:
        self.paths, self.cfg, self.gpu = paths, cfg, gpu
        self.prober = Prober("nvml-telemetry")
        self.reader: TelemetryReader | None = None
        self.gpm: GpmSampler | None = None
        self.driver: str | None = None  # the driver's version, read once per process

    def poll(self, b: ObservationBuilder) -> None:
        nv = self._init(b)
        if nv is None:
            return
        if self.reader is None:
            self.reader = TelemetryReader(nv)
            self.gpm = GpmSampler(self.reader) if self.cfg.gpm else None
        if self.driver is None:
            version = self.prober.call("driver", lambda: nvml.driver_version(nv), self.cfg.call_timeout)
            self.driver = version.value if version.ok else None
        if self.driver is not None:
            b.sample("node_health_gpu_driver_info", 1, version=self.driver)
        count = self.prober.call("count", nv.nvmlDeviceGetCount, self.cfg.call_timeout)
        if not count.ok:
            b.subject("gpus", f"nvmlDeviceGetCount: {count.error or 'hung'}")
            return
        for i in range(int(count.value or 0)):
            self._poll_gpu(b, i)

    def _init(self, b: ObservationBuilder) -> Any:
        """pynvml ready for use, or None (the GPU check says why NVML is unavailable)."""
        try:
            library = nvml_library(self.paths, self.gpu)
        except nvml.NvmlUnavailable as exc:
            b.subject("nvml", f"no telemetry: {exc}")
            return None
        res = nvml.init_probed(self.prober, library, self.cfg.call_timeout)
        if not res.ok:
            b.subject("nvml", f"no telemetry: {res.error or 'nvmlInit hung'}")
            return None
        return res.value

    def _poll_gpu(self, b: ObservationBuilder, i: int) -> None:
        gpu = str(i)
        res = self.prober.call(("gpu", i), partial(self._read, i), self.cfg.call_timeout)
        if res.hung_for is not None:
            b.sample("node_health_gpu_telemetry_up", 0, gpu=gpu)
            b.finding(f"gpu{i}", "NvmlCallHung", f"NVML telemetry calls for this GPU have not returned for {res.hung_for:.0f}s")
            return
        if res.error is not None:
            b.sample("node_health_gpu_telemetry_up", 0, gpu=gpu)
            b.finding(f"gpu{i}", "NvmlError", f"reading telemetry failed: {type(res.error).__name__}: {res.error}")
            return
        t = res.value
        assert t is not None
        b.sample("node_health_gpu_telemetry_up", 0 if t.lost else 1, gpu=gpu)
        if t.lost:
            b.subject(f"gpu{i}", "lost (GPU_IS_LOST): no telemetry")
            return
        b.extend(Observation(samples=tuple(t.samples)))
        b.subject(f"gpu{i}", _summary(t))
        if t.errors:
            b.finding(f"gpu{i}", "NvmlError", "telemetry: " + "; ".join(t.errors))

    def _read(self, index: int) -> Telemetry:
        """One GPU, in its probe thread."""
        assert self.reader is not None
        t = Telemetry(index)
        try:
            h = self.reader.handle(t)
            if h is not None:
                self.reader.read(t, h)
                if self.gpm is not None:
                    self.gpm.sample(t, h)
        except GpuLost:
            t.lost = True
        return t


def _summary(t: Telemetry) -> str:
    parts = [f"{len(t.samples)} series"]
    power, busy = t.value("node_health_gpu_power_watts"), t.value("node_health_gpu_utilization_ratio")
    if power is not None:
        parts.append(f"{power:.0f} W")
    if busy is not None:
        parts.append(f"{busy:.0%} busy")
    if t.unsupported:
        parts.append(f"not supported: {', '.join(sorted(set(t.unsupported)))}")
    return ", ".join(parts)
