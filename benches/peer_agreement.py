#!/usr/bin/env python3
"""Agreement with the peers' own test lines (tests/fixtures/kernel/peers/verdicts.tsv):
each peer verdict translated into the fault table's terms (`PEER_TO_AGENT`), each line
matched by the built-in table as `agent scan-log` matches it, agreement per peer, and
every disagreement listed (benches/README.md explains each)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.kernel.patterns import build, scan_log

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kernel" / "peers" / "verdicts.tsv"
# The peer's verdict → the patterns of the table that say the same ("-": no event).
PEER_TO_AGENT: dict[str, set[str]] = {
    "-": {"-"},
    "OOMKilling": {"oom_kill", "memcg_oom_kill"}, "UnregisterNetDevice": {"netdev_unregister_stuck"},
    "KernelOops": {"kernel_oops"}, "TaskHung": {"hung_task"}, "FilesystemIsReadOnly": {"fs_read_only"},
    "raid_array_failure": {"md_array_failed"}, "filesystem_read_only": {"fs_read_only"},
    "nvme_path_failure": {"nvme_no_path"}, "nvme_controller_timeout": {"nvme_timeout"},
    "nvme_device_disabled": {"nvme_failed"}, "beyond_end_of_device": {"beyond_end_of_device"},
    "buffer_io_error": {"block_io_error"}, "superblock_write_error": {"fs_superblock_write"},
    "nfs_server_not_responding": {"nfs_not_responding"}, "nfs_lock_reclaim_failed": {"nfs_lock_reclaim"},
    "vfs_file_max_limit_reached": {"file_max"}, "kernel_panic": {"kernel_panic"},
    "nvidia_peermem_invalid_context": {"peermem_invalid_context"}, "cpu_blocked_too_long": {"hung_task"},
    "cpu_soft_lockup": {"soft_lockup"}, "nvlink_post_rx_detect_failure": {"nvlink_rx_detect"},
    "efa_admin_cmd_timeout": {"efa_admin_timeout"}, "efa_admin_queue_closed": {"efa_admin_timeout"},
    "efa_admin_cmd_failed": set(),  # left out on purpose (docs/kernel.md): counted as a disagreement of taste
    "efa_device_reset_failed": {"efa_reset_failed"}, "efa_device_not_ready": {"efa_reset_failed"},
    "netdev_watchdog": {"tx_timeout"},
    # the EKS node monitoring agent's reasons (its KernelBug is any "BUG: " line: the oops forms too)
    "KernelBug": {"kernel_bug", "kernel_oops"}, "SoftLockup": {"soft_lockup"}, "AppBlocked": {"hung_task"},
    "ConntrackExceededKernel": {"conntrack_full"}, "BlockDeviceIOError": {"block_io_error"},
    "AppCrash": set(), "NvidiaNCCLError": set(),  # application crashes: not node faults (docs/kernel.md)
    # AWS Neuron (Trainium, Inferentia) devices: outside this agent (NVIDIA GPU nodes)
    "NeuronSRAMUncorrectableError": set(), "NeuronNCUncorrectableError": set(),
    "NeuronHBMUncorrectableError": set(), "NeuronDMAError": set(),
}


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    table = build()
    per: dict[str, list[int]] = {}
    wrong: list[str] = []
    for row in FIXTURE.read_text().splitlines():
        if not row or row.startswith("#"):
            continue
        peer, verdict, line = row.split("\t", 2)
        found = scan_log(line.encode(), table)
        ours = found[0][2].name if found else "-"
        ok = ours in PEER_TO_AGENT[verdict]
        per.setdefault(peer, [0, 0])[0] += ok
        per[peer][1] += 1
        if not ok:
            wrong.append(f"{peer}: {verdict} → agent {ours}: {line}")
    for peer, (agree, total) in per.items():
        print(f"{peer:11} {agree}/{total} agree ({100 * agree / total:.1f} %)")
    for w in wrong:
        print("  disagree:", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
