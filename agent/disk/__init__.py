"""Disks: every configured mount point (and the filesystem of the state dir)
mounted, writable, with free space and inodes, without I/O error signs.

- `settings`: the ``[checks.disk]`` section; `catalog`: its reasons and metrics;
- `monitor`: the engine the check (`agent.checks.disk`) runs;
- `mounts`, `targets`, `probes`, `devices`: the mount table, what is probed,
  statfs and the write probe, SCSI and block device signs;
- `report`: one target's samples and findings.

See docs/disk.md.
"""
