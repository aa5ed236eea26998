"""GPU Performance Monitoring (GPM, Hopper and later): profiling ratios without DCGM.

``nvmlGpmMetricsGet`` computes metrics between two samples of a GPU's
counters taken at least 100 ms apart (nvml.h). The telemetry poller takes one
sample per poll and computes the metrics between the previous poll's sample
and this one, so each value is the mean over one telemetry interval; the first
poll of a GPU has none. Two sample buffers per GPU are allocated once and
reused in turn.

GPM coexists with DCGM's profiling module and Nsight: those own the GPU's
perfmon unit exclusively, GPM reads a separate unit built for concurrent
collection (NVIDIA's DCGM maintainer, https://github.com/NVIDIA/DCGM/issues/62,
2025-01-17). A GPU without GPM (before Hopper; a vGPU guest, see
https://github.com/NVIDIA/dcgm-exporter/pull/701) answers ``isSupportedDevice
= 0`` or NOT_SUPPORTED: no GPM series for it, asked once per NVML session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import nvml
from .telemetry_read import Telemetry, TelemetryReader

# NVML_GPM_METRIC_* (percentages 0-100) → ratio metrics.
GPM_METRICS: tuple[tuple[int, str], ...] = (
    (1, "node_health_gpu_graphics_engine_activity_ratio"),  # GRAPHICS_UTIL (DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    (2, "node_health_gpu_sm_activity_ratio"),  # SM_UTIL (DCGM_FI_PROF_SM_ACTIVE)
    (3, "node_health_gpu_sm_occupancy_ratio"),  # SM_OCCUPANCY (DCGM_FI_PROF_SM_OCCUPANCY)
    (5, "node_health_gpu_tensor_activity_ratio"),  # ANY_TENSOR_UTIL (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
    (10, "node_health_gpu_dram_bandwidth_utilization_ratio"),  # DRAM_BW_UTIL (DCGM_FI_PROF_DRAM_ACTIVE)
)
GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION


@dataclass
class _Gpu:
    supported: bool | None = None
    buffers: list[Any] = field(default_factory=list)  # two nvmlGpmSample_t, used in turn
    previous: Any = None  # the buffer holding the last poll's sample
    request: Any = None  # one nvmlGpmMetricsGet_t, reused


class GpmSampler:
    """Per GPU (by UUID): whether GPM works, and its two sample buffers."""

    def __init__(self, reader: TelemetryReader) -> None:
        self.reader = reader
        self.nv = reader.nv
        self._gpus: dict[str, _Gpu] = {}

    def sample(self, t: Telemetry, h: Any) -> None:
        """Takes this poll's sample of the GPU and adds the metrics since the last one; raises GpuLost."""
        g = self._gpus.setdefault(t.uuid, _Gpu())
        if g.supported is None:
            support = self.reader.call(t, "gpm_support", lambda: self.nv.nvmlGpmQueryDeviceSupport(h))
            if support is not None and support.isSupportedDevice:
                g.buffers = [b for b in (self.reader.call(t, "gpm_alloc", self.nv.nvmlGpmSampleAlloc) for _ in range(2)) if b is not None]
            g.supported = len(g.buffers) == 2
        if not g.supported:
            return
        current = g.buffers[1] if g.previous is g.buffers[0] else g.buffers[0]
        if self.reader.call(t, "gpm_sample", lambda: self.nv.nvmlGpmSampleGet(h, current)) is None:
            g.previous = None
            if "gpm_sample" in t.unsupported:  # e.g. a vGPU guest: GPM reported but unusable
                self._drop(g)
            return
        if g.previous is not None:
            self._metrics(t, g, g.previous, current)
        g.previous = current

    def _metrics(self, t: Telemetry, g: _Gpu, first: Any, second: Any) -> None:
        nv = self.nv
        if g.request is None:
            g.request = nv.c_nvmlGpmMetricsGet_t()
            g.request.version = GET_VERSION
            g.request.numMetrics = len(GPM_METRICS)
            for i, (metric_id, _) in enumerate(GPM_METRICS):
                g.request.metrics[i].metricId = metric_id
        g.request.sample1, g.request.sample2 = first, second
        if self.reader.call(t, "gpm_metrics", lambda: nv.nvmlGpmMetricsGet(g.request)) is None:
            return
        for i, (metric_id, name) in enumerate(GPM_METRICS):
            m = g.request.metrics[i]
            if m.nvmlReturn == 0:
                t.add(name, min(max(m.value / 100, 0.0), 1.0))
            elif m.nvmlReturn == nvml.GPU_IS_LOST:
                t.lost = True
            else:
                t.unsupported.append(f"gpm{metric_id}")

    def _drop(self, g: _Gpu) -> None:
        g.supported = False
        self.close(g)

    def close(self, g: _Gpu | None = None) -> None:
        """Frees the sample buffers (of one GPU, or of all)."""
        for gpu in [g] if g is not None else list(self._gpus.values()):
            for buf in gpu.buffers:
                try:
                    self.nv.nvmlGpmSampleFree(buf)
                except Exception:  # noqa: BLE001 - freeing after the session ended
                    pass
            gpu.buffers, gpu.previous = [], None
