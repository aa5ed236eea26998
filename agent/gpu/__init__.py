"""GPU health: NVML polling, the Xid catalog, the kernel-log and NVML-event
Xid stream. `agent.checks.gpu` wires these into the check/finding flow; pynvml
is imported only inside `agent.gpu.nvml`, when the check is enabled."""
