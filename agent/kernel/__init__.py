"""Kernel faults: the kernel-log fault table (hung tasks, lockups, oops, OOM,
machine checks, mlx5, NVMe, ...) and EDAC memory-error counts."""
