"""What the kernel feature declares to the catalog: the kernel-log fault table
(`PATTERNS`), its reasons and metrics, and EDAC's.

Every pattern is matched against the text of one kernel log message (a
``/dev/kmsg`` record's message, or a saved log's line without its timestamp,
host and ``kernel:`` prefix), from its start, as the kernel prints it. The
formats are the kernel's own (file named per pattern; node-problem-detector's
``config/kernel-monitor.json``, GPUd's and NVSentinel's matchers agree).

`threshold` matches within `window` raise the finding; it stays `hold`
seconds after the last match, or until the node reboots (`hold` None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

_CRIT, _WARN, _INFO = Severity.CRITICAL, Severity.WARNING, Severity.INFO
MINUTE, HOUR = 60.0, 3600.0
OPERATOR_REASON = "KernelLogPattern"  # the reason of a pattern an operator adds in the config without naming one
# A reason an operator names: CamelCase (a capital, then letters and digits), as the built-ins and
# node-problem-detector's reasons are; 64 characters at most (it is a condition reason and a taint value).
REASON_NAME = re.compile(r"[A-Z][A-Za-z0-9]{1,63}")


@dataclass(frozen=True, slots=True)
class FaultPattern:
    name: str  # the finding's subject and the `fault` label: [a-z0-9_]+
    reason: str
    severity: Severity
    action: str  # one of agent.findings.ACTIONS: what the finding asks of the node
    pattern: str  # a Python regular expression, matched at the start of the message
    threshold: int = 1  # matches within `window` that raise the finding
    window: float = 10 * MINUTE
    hold: float | None = HOUR  # after the last match; None: until the node reboots
    summary: str = ""
    # (prefix, needle) pairs, one of which every message the pattern matches starts with (and holds
    # the needle after it): the native screen (agent.kernel.patterns). Empty: screened by the regex.
    screen: tuple[tuple[str, str], ...] = ()
    # A line that announces this fault (matched at the start of a message, never counted itself), and
    # the message after it that this pattern then claims (pre-5.x kernels: "Memory cgroup out of memory:
    # Kill process ..." then a bare "Killed process ..."). The next message a pattern matches, or that
    # announces another fault, ends the announcement. The screen must also accept the announcing line.
    prelude: str = ""
    then: str = ""


def _p(name: str, reason: str, severity: Severity, action: str, pattern: str, summary: str, **kw: object) -> FaultPattern:
    return FaultPattern(name, reason, severity, action, pattern, summary=summary, **kw)  # type: ignore[arg-type]


# Order matters only for a message two patterns would match: the first wins
# (a soft lockup's "BUG: soft lockup" is not also a generic "BUG:").
PATTERNS: tuple[FaultPattern, ...] = (
    # kernel/hung_task.c: pr_err("INFO: task %s:%d blocked for more than %ld seconds.\n")
    _p("hung_task", "KernelHungTask", _WARN, "none",
       r"INFO: task .+:\d+ blocked for more than \d+ seconds\.",
       "A task was in uninterruptible sleep longer than kernel.hung_task_timeout_secs (at most hung_task_warnings reports a boot).",
       hold=30 * MINUTE,
       screen=(('INFO: task ', 'blocked for more than'),)),
    # kernel/rcu/tree_stall.h: pr_err("INFO: %s self-detected stall on CPU") / "detected stalls on CPUs/tasks:",
    # tree_exp.h "INFO: %s detected expedited stalls on CPUs/tasks: {"; tasks.h "INFO: rcu_tasks detected stalls on tasks:"
    _p("rcu_stall", "KernelRcuStall", _WARN, "none",
       r"(?:rcu: )?INFO: rcu_[a-z_]+ (?:self-detected stall on CPU|detected (?:expedited )?stalls? on (?:CPUs?|tasks))",
       "An RCU grace period stalled: a CPU did not pass a quiescent state for rcu_cpu_stall_timeout.",
       hold=30 * MINUTE,
       screen=(('rcu: INFO: rcu_', ''), ('INFO: rcu_', ''))),
    # kernel/watchdog.c: pr_emerg("BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]\n"), pr_fmt "watchdog: "
    # (4.x, where the NMI watchdog's file printed it: "NMI watchdog: "; before 3.x no prefix)
    _p("soft_lockup", "KernelSoftLockup", _WARN, "none",
       r"(?:(?:NMI )?watchdog: )?BUG: soft lockup - CPU#\d+ stuck for \d+s!",
       "A CPU ran kernel code without scheduling for longer than the soft-lockup threshold.",
       hold=30 * MINUTE,
       screen=(('watchdog: BUG: soft lockup', ''), ('NMI watchdog: BUG: soft lockup', ''), ('BUG: soft lockup', ''))),
    # kernel/watchdog.c (perf and buddy detectors): "Watchdog detected hard LOCKUP on cpu %d"
    _p("hard_lockup", "KernelHardLockup", _CRIT, "reboot",
       r"(?:(?:NMI )?watchdog: )?Watchdog detected hard LOCKUP on cpu \d+",
       "A CPU stopped taking interrupts (hard lockup): the kernel cannot be trusted until a reboot.", hold=None,
       screen=(('watchdog: Watchdog detected hard LOCKUP', ''), ('NMI watchdog: Watchdog detected hard LOCKUP', ''), ('Watchdog detected hard LOCKUP', ''))),
    # arch/x86/mm/fault.c, arch/x86/kernel/dumpstack.c, lib/bug.c, arch/x86/kernel/traps.c; arm64 (Grace):
    # arch/arm64/mm/fault.c die_kernel_fault "Unable to handle kernel %s at virtual address %016lx",
    # arch/arm64/kernel/traps.c die "Internal error: %s: %016lx [#%d]"
    _p("kernel_oops", "KernelOops", _CRIT, "reboot",
       r"(?:Oops: |kernel BUG at \S+:\d+!|general protection fault|divide error: \d+ \[#\d+\]"
       r"|BUG: unable to handle |BUG: kernel NULL pointer dereference"
       r"|Unable to handle kernel [a-zA-Z -]+ at virtual address [0-9a-f]+|Internal error: [^:]+: [0-9a-f]+ \[#\d+\])",
       "A kernel oops (page fault in the kernel, general protection fault, BUG_ON): a task died holding kernel state.",
       hold=None,
       screen=(('Oops: ', ''), ('kernel BUG at ', ''), ('general protection fault', ''), ('divide error: ', ''), ('BUG: unable to handle ', ''), ('BUG: kernel NULL pointer dereference', ''),
               ('Unable to handle kernel ', ' at virtual address '), ('Internal error: ', ' [#'))),
    # kernel/panic.c: pr_emerg("Kernel panic - not syncing: %s\n"); seen in saved logs (scan-log), pstore
    _p("kernel_panic", "KernelPanic", _CRIT, "reboot", r"Kernel panic - not syncing: ",
       "The kernel panicked (seen in a saved log or a console capture).", hold=None,
       screen=(('Kernel panic - not syncing: ', ''),)),
    # any other "BUG: " report: scheduling while atomic, Bad page state, workqueue lockup, ...
    _p("kernel_bug", "KernelBug", _WARN, "none", r"BUG: ",
       "Another kernel BUG report (scheduling while atomic, bad page state, workqueue lockup, ...).", hold=HOUR,
       screen=(('BUG: ', ''),)),
    # mm/oom_kill.c: "%s: Killed process %d (%s) total-vm:..." where %s is "Out of memory" or
    # "Memory cgroup out of memory"; kernels before 5.1 print "%s: Kill process %d (%s) score %u or
    # sacrifice child" (before 4.6: "or a child"), then "Killed process %d (%s) total-vm:..." alone: the
    # bare line is classed by the line that announced it (`prelude`), a node OOM unless a cgroup's.
    # One kill is one match: "invoked oom-killer" and "oom-kill:constraint=" lines of the same report are not counted.
    _p("oom_kill", "KernelOomKill", _WARN, "none",
       r"(?:Out of memory: )?Killed process \d+ \(",
       "The kernel's OOM killer killed a process because the node ran out of memory.", hold=10 * MINUTE,
       prelude=r"Out of memory(?: \([a-z_]+\))?: Kill process \d+ \(",
       screen=(('Out of memory: Killed process ', ''), ('Killed process ', ''), ('Out of memory', ': Kill process '))),
    _p("memcg_oom_kill", "KernelMemcgOomKill", _INFO, "none",
       r"Memory cgroup out of memory: Killed process \d+ \(",
       "A process was killed at its cgroup's memory limit (a container over its limit; the node is fine).",
       hold=10 * MINUTE, prelude=r"Memory cgroup out of memory: Kill process \d+ \(", then=r"Killed process \d+ \(",
       screen=(('Memory cgroup out of memory: Killed process ', ''), ('Memory cgroup out of memory: Kill process ', ''))),
    # arch/x86/kernel/cpu/mce/core.c (pr_fmt "mce: ", HW_ERR "[Hardware Error]: "; before 4.x no "mce: ");
    # rate-limited to 2 a minute
    _p("machine_check", "MachineCheck", _WARN, "none",
       r"(?:mce: )?\[Hardware Error\]: (?:Machine check events logged|CPU \d+: Machine Check)",
       "A machine check was logged (CPU, cache or memory); EDAC's counts say whether it was corrected.",
       screen=(('mce: [Hardware Error]: ', ''), ('[Hardware Error]: Machine check events logged', ''), ('[Hardware Error]: CPU ', ': Machine Check'))),
    # mm/memory-failure.c: pr_fmt "Memory failure: ", "%#lx: recovery action for %s: %s"
    _p("memory_failure", "MemoryFailure", _WARN, "none", r"Memory failure: 0x[0-9a-f]+: ",
       "The kernel poisoned a page after an uncorrected memory error (memory-failure handling).",
       screen=(('Memory failure: 0x', ''),)),
    # drivers/acpi/apei/ghes.c + drivers/firmware/efi/cper.c: "{%u}[Hardware Error]: event severity: %s"
    _p("hw_error_fatal", "HardwareErrorFatal", _CRIT, "drain_and_diagnose",
       r"\{\d+\}\[Hardware Error\]: event severity: fatal",
       "Firmware (APEI GHES / CPER) reported a fatal hardware error.", hold=None,
       screen=(('{', '[Hardware Error]: event severity: fatal'),)),
    _p("hw_error_recoverable", "HardwareErrorRecoverable", _WARN, "drain_and_diagnose",
       r"\{\d+\}\[Hardware Error\]: event severity: recoverable",
       "Firmware (APEI GHES / CPER) reported an uncorrected, recoverable hardware error.",
       screen=(('{', '[Hardware Error]: event severity: recoverable'),)),
    _p("hw_error_corrected", "HardwareErrorCorrected", _INFO, "none",
       r"(?:\{\d+\}\[Hardware Error\]: event severity: corrected|(?:mce: )?\[Hardware Error\]: Corrected error, no action required)",
       "A corrected hardware error was reported (counted; the EDAC check judges the rate).",
       screen=(('{', '[Hardware Error]: event severity: corrected'), ('[Hardware Error]: Corrected error', ''), ('mce: [Hardware Error]: Corrected error', ''))),
    # drivers/edac/edac_mc.c: "EDAC MC%d: %d CE %s on %s (...)" (KERN_WARNING) / "... UE ..." (KERN_EMERG)
    _p("edac_ue", "EdacUncorrectedLogged", _CRIT, "drain_and_diagnose", r"EDAC MC\d+: \d+ UE ",
       "EDAC logged an uncorrected memory error.", hold=None,
       screen=(('EDAC MC', ' UE '),)),
    _p("edac_ce", "EdacCorrectedLogged", _INFO, "none", r"EDAC MC\d+: \d+ CE ",
       "EDAC logged corrected memory errors (counted; the EDAC check judges the rate).",
       screen=(('EDAC MC', ' CE '),)),
    # drivers/net/ethernet/mellanox/mlx5/core/cmd.c: wait_func "%s(0x%x) timeout. Will cause a leak of a
    # command resource"; cb_timeout_handler (an asynchronous command) "cmd[%d]: %s(0x%x) Async, timeout. Will ..."
    _p("mlx5_cmd_timeout", "Mlx5CommandTimeout", _CRIT, "reboot",
       r"mlx5_core \S+: .*\(0x[0-9a-f]+\)(?: Async,)? timeout\. Will cause a leak of a command resource",
       "A ConnectX (mlx5) firmware command timed out: the adapter's firmware no longer answers.", hold=None,
       screen=(('mlx5_core ', ' timeout. Will cause a leak of a command resource'),)),
    # .../mlx5/core/health.c: poll_health, print_health_info (6.x: "Health issue observed, %s, severity(%d) %s:"
    # with the syndrome's name), mlx5_fw_fatal_reporter_err_work, mlx5_health_try_recover ("health recovery
    # flow aborted, PCI reads still not working" / "PCI channel offline" / "unexpected NIC IFC mode %d", "health
    # recovery failed")
    _p("mlx5_fatal", "Mlx5Fatal", _CRIT, "reboot",
       r"mlx5_core \S+: .*(?:device's health compromised - reached miss count|unrecoverable hardware error"
       r"|Fatal error \d+ detected|Driver is in error state\. Unloading|health recovery flow aborted|health recovery failed)",
       "A ConnectX (mlx5) adapter is in a fatal state (health counter stopped, unrecoverable error, FW fatal).",
       hold=None,
       screen=(('mlx5_core ', "device's health compromised - reached miss count"), ('mlx5_core ', 'unrecoverable hardware error'), ('mlx5_core ', 'Fatal error '), ('mlx5_core ', 'Driver is in error state. Unloading'),
               ('mlx5_core ', 'health recovery f'))),
    # .../mlx5/core/health.c print_health_info: any other health syndrome the firmware raised (the fatal
    # ones are Mlx5Fatal above): "Health issue observed, firmware internal error, severity(3) ERROR:";
    # before 6.1 "synd 0x%x: %s". The firmware reporter recovers the adapter when it can.
    _p("mlx5_health_syndrome", "Mlx5HealthSyndrome", _WARN, "none",
       r"mlx5_core \S+: .*(?:Health issue observed, |synd 0x[0-9a-f]+: )",
       "A ConnectX (mlx5) adapter's firmware raised a health syndrome (not one of the fatal ones).",
       hold=HOUR,
       screen=(('mlx5_core ', 'Health issue observed, '), ('mlx5_core ', 'synd 0x'))),
    # net/sched/sch_generic.c dev_watchdog: before 6.8, pr_info/WARN_ONCE "NETDEV WATCHDOG: %s (%s): transmit
    # queue %u timed out %u ms"; since 6.8 (6.6.47, 6.1.107) netdev_crit "NETDEV WATCHDOG: CPU: %d: transmit
    # queue %u timed out %u ms", after netdev_printk's "<driver> <bus id> <ifname>[ (reg state)]: " head
    # (or "<ifname>: " without a parent device). The head varies: screened by a needle anywhere.
    _p("tx_timeout", "NetdevTxTimeout", _WARN, "none",
       r"(?:(?:\S+ \S+ )?\S+(?: \(un[a-z]+\))?: )?NETDEV WATCHDOG: (?:\S+ \(\S+\)|CPU: \d+): transmit queue \d+ timed out",
       "A NIC transmit queue stalled and the driver reset it.", hold=30 * MINUTE,
       screen=(('', 'NETDEV WATCHDOG: '),)),
    # drivers/nvme/host/pci.c nvme_timeout: "I/O %d QID %d timeout, ..." / "I/O tag %d (%04x) opcode ... QID %d timeout, ..."
    _p("nvme_timeout", "NvmeTimeout", _WARN, "none", r"nvme nvme\d+: I/O (?:tag )?\d+ .*QID \d+ timeout",
       "An NVMe command timed out (the driver aborts it or resets the controller).",
       screen=(('nvme nvme', ' timeout'),)),
    _p("nvme_reset", "NvmeControllerReset", _WARN, "none", r"nvme nvme\d+: controller is down; will reset",
       "An NVMe controller stopped answering and is being reset.",
       screen=(('nvme nvme', 'controller is down; will reset'),)),
    _p("nvme_failed", "NvmeControllerFailed", _CRIT, "drain_and_diagnose",
       r"nvme nvme\d+: (?:Removing after probe failure|Device not ready; aborting|Disabling device after reset failure)",
       "An NVMe controller failed its reset and was removed: its namespaces are gone.", hold=None,
       screen=(('nvme nvme', 'Removing after probe failure'), ('nvme nvme', 'Device not ready; aborting'), ('nvme nvme', 'Disabling device after reset failure'))),
    # block/blk-core.c blk_print_req_error ("%s error, dev %s, sector %llu ..."; older "blk_update_request: ",
    # 3.x kernels such as RHEL 7's 3.10 "end_request: "),
    # fs/buffer.c "Buffer I/O error on dev %pg, logical block %llu". The disk check counts SCSI ioerr_cnt
    # and ext4's error counter for its mounts; these lines cover every device (NVMe, virtio) and filesystem.
    _p("block_io_error", "BlockIOError", _WARN, "none",
       r"(?:blk_update_request: |end_request: )?(?:I/O|critical medium|critical target|critical nexus|recoverable transport|timeout)"
       r" error, dev \S+, sector \d+|Buffer I/O error on dev(?:ice)? \S+, ",
       "The block layer failed an I/O on a device (medium, transport or timeout error).",
       screen=(('blk_update_request: ', ' error, dev '), ('end_request: ', ' error, dev '), ('I/O error, dev ', ''), ('critical ', ' error, dev '), ('recoverable transport error, dev ', ''), ('timeout error, dev ', ''), ('Buffer I/O error on dev', ''))),
    # fs/xfs/xfs_fsops.c xfs_do_force_shutdown: "Corruption of in-memory data (0x%x) detected ... Shutting down filesystem"
    _p("xfs_shutdown", "FilesystemShutdown", _CRIT, "drain_and_diagnose",
       r"XFS \(\S+\): .*(?:Shutting down filesystem|Filesystem has been shut down)",
       "An XFS filesystem shut itself down after an I/O error or corruption: it fails every operation until remounted.",
       hold=None,
       screen=(('XFS (', 'Shutting down filesystem'), ('XFS (', 'Filesystem has been shut down'))),
    # fs/ext4/super.c ext4_handle_error: ext4_msg(KERN_CRIT, "Remounting filesystem read-only"); ext3's
    # "error: remounting filesystem read-only", f2fs's, btrfs's "forced readonly", fat's "Filesystem has been
    # set read-only". Every filesystem, not only the mounts the disk check watches (DiskReadOnly).
    _p("fs_read_only", "FilesystemReadOnly", _CRIT, "drain_and_diagnose",
       r"(?:EXT[234]|F2FS)-fs \(\S+\): (?:error: )?[Rr]emounting filesystem read-only"
       r"|BTRFS(?: info)? \(device \S+\): forced readonly|FAT-fs \(\S+\): Filesystem has been set read-only",
       "A filesystem remounted itself read-only after an error: every write to it fails until it is repaired.",
       hold=None,
       screen=(('EXT', 'emounting filesystem read-only'), ('F2FS-fs (', 'emounting filesystem read-only'),
               ('BTRFS', 'forced readonly'), ('FAT-fs (', 'Filesystem has been set read-only'))),
    # fs/ext4/super.c ext4_commit_super: ext4_msg(KERN_ERR, "I/O error while writing superblock")
    _p("fs_superblock_write", "FilesystemSuperblockWriteError", _WARN, "drain_and_diagnose",
       r"EXT[234]-fs \(\S+\): I/O error while writing superblock",
       "A filesystem could not write its superblock (an I/O error on its device).",
       screen=(('EXT', 'I/O error while writing superblock'),)),
    # fs/ext4/super.c __ext4_error: "EXT4-fs error (device %s): %s:%d: comm %s: %pV"; __ext4_warning
    # "EXT4-fs warning (device %s): %s:%d: %pV". The disk check reads ext4's error count for its mounts.
    _p("ext4_error", "Ext4Error", _WARN, "none", r"EXT4-fs error \(device \S+\): ",
       "ext4 found an error (corruption or an I/O error) on a filesystem; errors=remount-ro turns it read-only.",
       screen=(('EXT4-fs error (device ', ''),)),
    _p("ext4_warning", "Ext4Warning", _INFO, "none", r"EXT4-fs warning \(device \S+\): ",
       "ext4 warned about a filesystem (a full directory index, a delayed allocation failure, ...).",
       hold=10 * MINUTE,
       screen=(('EXT4-fs warning (device ', ''),)),
    # block/blk-core.c bio_check_eod: "%s: attempt to access beyond end of device\n%pg: rw=%d, sector=..."
    # (5.10+, after the task's comm), before: "attempt to access beyond end of device" alone.
    _p("beyond_end_of_device", "BlockBeyondEndOfDevice", _WARN, "none",
       r"(?:\S+: )?attempt to access beyond end of device",
       "An I/O asked for sectors past the end of a device (a partition table or filesystem that does not fit its device).",
       screen=(('', 'attempt to access beyond end of device'),)),
    # drivers/md/raid1.c, raid10.c, raid5.c: pr_crit("md/raid1:%s: Disk failure on %pg, disabling device.") and
    # md.c / raid1 (last device): "md/raid1:%s: Disk failure on %pg detected, failing array."; raid5
    # "md/raid:%s: Cannot continue operation (%d/%d failed)."
    _p("md_array_failed", "MdArrayFailed", _CRIT, "drain_and_diagnose",
       r"md/raid\d*:\S+: (?:Disk failure on \S+ detected, failing array|Cannot continue operation)",
       "An md RAID array failed: too few of its devices are left to run it.", hold=None,
       screen=(('md/raid', 'failing array'), ('md/raid', 'Cannot continue operation'))),
    _p("md_disk_failed", "MdDiskFailed", _WARN, "none",
       r"md/raid\d*:\S+: Disk failure on \S+, disabling device",
       "An md RAID array lost a member device and runs degraded.", hold=None,
       screen=(('md/raid', 'Disk failure on '),)),
    # drivers/nvme/host/multipath.c nvme_ns_head_submit_bio: dev_warn_ratelimited("no available path - failing I/O")
    _p("nvme_no_path", "NvmeNoPath", _CRIT, "drain_and_diagnose",
       r"block nvme\d+n\d+: no available path - failing I/O",
       "An NVMe namespace has no usable path left: every I/O to it fails.",
       screen=(('block nvme', 'no available path - failing I/O'),)),
    # fs/nfs/... "nfs: server %s not responding, still trying" / "timed out" (soft mounts); "nfs: server %s OK"
    # when it answers again (not matched). The disk check sees the mount hang; this line names the server.
    _p("nfs_not_responding", "NfsServerNotResponding", _WARN, "none",
       r"nfs: server \S+ not responding, (?:still trying|timed out)",
       "An NFS server stopped answering this client (the line names the server).", hold=30 * MINUTE,
       screen=(('nfs: server ', ' not responding, '),)),
    # fs/nfs/nfs4state.c nfs4_reclaim_open_state: pr_err("NFS: %s: Lock reclaim failed!")
    _p("nfs_lock_reclaim", "NfsLockReclaimFailed", _WARN, "none",
       r"NFS: \S+: Lock reclaim failed!",
       "After an NFS server restarted, this client could not reclaim a file lock: an application lost it.",
       screen=(('NFS: ', 'Lock reclaim failed!'),)),
    # net/core/dev.c netdev_wait_allrefs: pr_emerg("unregister_netdevice: waiting for %s to become free. Usage
    # count = %d") every 10 s while a device's references are held: three in 5 min is one stuck for 20 s or more.
    _p("netdev_unregister_stuck", "NetdevUnregisterStuck", _WARN, "none",
       r"unregister_netdevice: waiting for \S+ to become free\. Usage count = -?\d+",
       "A network device cannot be removed (its references are held): pod network teardown and setup hang.",
       threshold=3, window=5 * MINUTE, hold=30 * MINUTE,
       screen=(('unregister_netdevice: waiting for ', ''),)),
    # net/netfilter/nf_conntrack_core.c: net_warn_ratelimited("nf_conntrack: table full, dropping packet")
    # under pr_fmt "nf_conntrack: "; older kernels "nf_conntrack: table full" alone, and ip_conntrack's.
    _p("conntrack_full", "ConntrackTableFull", _WARN, "none",
       r"(?:nf_conntrack: )?(?:nf|ip)_conntrack: table full, dropping packet",
       "The connection-tracking table is full (net.netfilter.nf_conntrack_max): new connections are dropped.",
       hold=30 * MINUTE,
       screen=(('nf_conntrack: ', 'table full, dropping packet'), ('ip_conntrack: table full', ''))),
    # fs/file_table.c alloc_empty_file: pr_info("VFS: file-max limit %lu reached")
    _p("file_max", "FileMaxReached", _WARN, "none", r"VFS: file-max limit \d+ reached",
       "The system-wide open-file limit (fs.file-max) was reached: opening a file fails with ENFILE.",
       hold=30 * MINUTE,
       screen=(('VFS: file-max limit ', ''),)),
    # drivers/infiniband/hw/efa/efa_com.c (AWS EFA), through ibdev_err ("infiniband <ibdev>: ") or dev_err
    # ("efa <bdf>: "): "Wait for completion (polling) timeout", "The device didn't send any completion for admin
    # cmd %s(%d) status %d ...", "Admin queue is closed". The ENA driver shares words: anchored on efa's heads.
    _p("efa_admin_timeout", "EfaAdminTimeout", _CRIT, "reboot",
       r"(?:efa [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]|infiniband (?:rdmap|efa_)\S*): "
       r"(?:Wait for completion \(polling\) timeout|The device didn't send any completion for admin cmd|Admin queue is closed)",
       "An AWS EFA adapter stopped answering its admin commands: the device is unusable until it is reset.",
       hold=None,
       screen=(('efa ', 'Wait for completion (polling) timeout'), ('efa ', "The device didn't send any completion"), ('efa ', 'Admin queue is closed'),
               ('infiniband ', 'Wait for completion (polling) timeout'), ('infiniband ', "The device didn't send any completion"), ('infiniband ', 'Admin queue is closed'))),
    # efa_com.c efa_com_dev_reset / efa_com_validate_version: "Reset indication didn't turn on|off", "Device
    # isn't ready, can't reset device", "Device isn't ready, abort com init %#x"
    _p("efa_reset_failed", "EfaResetFailed", _CRIT, "drain_and_diagnose",
       r"(?:efa [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]|infiniband (?:rdmap|efa_)\S*): "
       r"(?:Reset indication didn't turn (?:on|off)|Device isn't ready, (?:can't reset device|abort com init))",
       "An AWS EFA adapter failed its reset or never became ready: a reboot of the guest is unlikely to help.",
       hold=None,
       screen=(('efa ', 'Reset indication didn'), ('efa ', "Device isn't ready, "), ('infiniband ', 'Reset indication didn'), ('infiniband ', "Device isn't ready, "))),
    # drivers/net/ethernet/mellanox/mlx5/core/events.c: "Detected insufficient power on the PCIe slot (%dW)."
    _p("mlx5_pcie_power", "Mlx5PciePowerInsufficient", _WARN, "none",
       r"mlx5_core \S+: .*Detected insufficient power on the PCIe slot",
       "A ConnectX (mlx5) adapter reports its PCIe slot gives it too little power.", hold=None,
       screen=(('mlx5_core ', 'Detected insufficient power on the PCIe slot'),)),
    # events.c port_module_event: "Port module event[error]: module %u, %s, %s" with "High Temperature"
    _p("mlx5_module_temperature", "Mlx5ModuleHighTemperature", _WARN, "none",
       r"mlx5_core \S+: .*Port module event(?:\[error\])?: module \d+, .*High Temperature",
       "A ConnectX (mlx5) port's cable module (optic) reports a high temperature.",
       screen=(('mlx5_core ', 'High Temperature'),)),
    # nvidia-peermem.c (GPUDirect RDMA): peer_err("%s:%d ERROR detected invalid context, skipping further processing")
    _p("peermem_invalid_context", "PeermemInvalidContext", _WARN, "none",
       r"nvidia-peermem \S+:\d+ ERROR detected invalid context, skipping further processing",
       "nvidia-peermem saw a GPU memory registration whose context was already gone (a GPUDirect RDMA teardown race).",
       screen=(('nvidia-peermem ', 'ERROR detected invalid context'),)),
    # NVIDIA driver (GH100/GB100 NVLink discovery): "NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's
    # postRxDetLinkMask failed!", "NVRM: knvlinkUpdatePostRxDetectLinkMask_IMPL: Failed to update Rx Detect Link mask!"
    _p("nvlink_rx_detect", "NvlinkRxDetectFailed", _WARN, "drain_and_diagnose",
       r"NVRM: (?:knvlinkDiscoverPostRxDetLinks_\w+: Getting peer\d+(?:'s)? postRxDetLinkMask failed!"
       r"|knvlinkUpdatePostRxDetectLinkMask_\w+: Failed to update Rx Detect Link mask!)",
       "The NVIDIA driver could not find an NVLink peer's links at discovery: NVLink to that peer is missing until a reboot.",
       hold=None,
       screen=(('NVRM: knvlink', 'postRxDetLinkMask failed!'), ('NVRM: knvlink', 'Failed to update Rx Detect Link mask!'))),
)


def _r(name: str, severity: Severity, summary: str, action: str = "none", unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Kernel", action=action)


REASONS: tuple[Reason, ...] = (
    *(_r(p.reason, p.severity, p.summary, p.action) for p in PATTERNS),
    _r(OPERATOR_REASON, _WARN, "A pattern of checks.kernel.patterns that names no reason of its own matched; its severity and action are the ones configured."),
    _r("KernelLogUnavailable", _WARN, "The kernel log cannot be read; kernel faults are not seen.", unknown=True),
    _r("EdacUncorrectable", _CRIT, "An EDAC memory controller counted uncorrected memory errors this boot.", "drain_and_diagnose"),
    _r("EdacCorrectedRate", _WARN, "Corrected memory errors on a DIMM (or a controller) in 24 h at or above checks.kernel.edac_ce_per_day."),
)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("node_health_kernel_faults_total", "counter", "Kernel log messages that matched the fault table, by pattern, this boot.", ("fault",)),
    MetricSpec(
        "node_health_kernel_faults_not_kernel_total",
        "counter",
        "Kernel log records written by a process (syslog facility not kern) that looked like a fault, this boot; never findings.",
    ),
    MetricSpec("node_health_kernel_log_up", "gauge", "1 while the kernel-fault follower reads the kernel log."),
    MetricSpec(
        "node_health_edac_errors_total",
        "counter",
        "Memory errors counted by an EDAC memory controller (ce_count, ue_count; noinfo: not attributed to a DIMM).",
        ("controller", "type"),
    ),
    MetricSpec(
        "node_health_edac_dimm_errors_total",
        "counter",
        "Memory errors counted per DIMM or chip-select row (dimmN/dimm_ce_count, csrowN/ce_count, ...).",
        ("controller", "dimm", "type"),
    ),
)

CATALOG = Catalog.declare(REASONS, METRICS)
# The reasons a pattern may take as its own: those of the table's patterns and KernelLogPattern. An
# operator's pattern may name one of them (another wording of the same fault) or a reason of its own.
PATTERN_REASONS = frozenset([*(p.reason for p in PATTERNS), OPERATOR_REASON])


def reason_problem(reason: str) -> str | None:
    """Why an operator's pattern cannot have `reason` (None: it can). The agent's other reasons are refused
    by the config loader (`agent.config`), which knows every feature's."""
    if not REASON_NAME.fullmatch(reason):
        return f'expected a CamelCase reason of letters and digits, 2 to 64 characters, starting with a capital (e.g. "TaskHung"), got "{reason}"'
    if reason in PATTERN_REASONS:
        return None
    taken = {r.lower(): r for r in CATALOG.reasons}
    if reason.lower() in taken:
        return f'expected a reason of its own or one of the fault table\'s; "{reason}" is (or differs only in case from) the agent\'s reason "{taken[reason.lower()]}"'
    return None


def operator_reasons(patterns: Sequence[FaultPattern]) -> tuple[Reason, ...]:
    """The catalog entries of the reasons that `patterns` name and the kernel catalog lacks (an operator's):
    family Kernel; per reason the worst severity of its patterns and that pattern's action (a finding
    carries its own pattern's severity and action)."""
    by_reason: dict[str, list[FaultPattern]] = {}
    for p in patterns:
        if p.reason not in CATALOG.reasons:
            by_reason.setdefault(p.reason, []).append(p)
    out = []
    for reason, ps in by_reason.items():
        worst = max(ps, key=lambda p: p.severity.rank)
        names = ", ".join(p.name for p in ps)
        out.append(_r(reason, worst.severity, f"An operator's pattern matched (checks.kernel.patterns: {names}).", worst.action))
    return tuple(out)


def with_reasons(extra: Iterable[Reason]) -> Catalog:
    """The kernel catalog with an operator's reasons added."""
    extra = tuple(extra)
    return Catalog.merge(CATALOG, Catalog.declare(extra)) if extra else CATALOG
