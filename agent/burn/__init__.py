"""The GPU burn test: stress every GPU at once, verify what it computed,
compare the GPUs with each other, watch NVML meanwhile (docs/burn.md).

- `orchestrator`: one burn over a `backend` (the built-in CUDA worker, one
  process per GPU, or DCGM's `dcgmi diag`) with a hard deadline per job;
- `verdict`: cross-GPU checks (digests, stragglers, expected figures);
- `watch` / `nvml`: what NVML says during the burn;
- `preflight`: once per boot, persisted per boot id, as an event source;
- `worker`, `gpuburn`, `cuda`, `cublas`, `kernels`: what runs on the GPU,
  only ever inside a worker process.
"""
