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

from dataclasses import dataclass

from ..catalog import Catalog, MetricSpec, Reason
from ..findings import Severity

_CRIT, _WARN, _INFO = Severity.CRITICAL, Severity.WARNING, Severity.INFO
MINUTE, HOUR = 60.0, 3600.0
OPERATOR_REASON = "KernelLogPattern"  # the reason of every pattern an operator adds in the config


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
    # block/blk-core.c blk_print_req_error ("%s error, dev %s, sector %llu ..."; older "blk_update_request: "),
    # fs/buffer.c "Buffer I/O error on dev %pg, logical block %llu". The disk check counts SCSI ioerr_cnt
    # and ext4's error counter for its mounts; these lines cover every device (NVMe, virtio) and filesystem.
    _p("block_io_error", "BlockIOError", _WARN, "none",
       r"(?:blk_update_request: )?(?:I/O|critical medium|critical target|critical nexus|recoverable transport|timeout)"
       r" error, dev \S+, sector \d+|Buffer I/O error on dev(?:ice)? \S+, ",
       "The block layer failed an I/O on a device (medium, transport or timeout error).",
       screen=(('blk_update_request: ', ' error, dev '), ('I/O error, dev ', ''), ('critical ', ' error, dev '), ('recoverable transport error, dev ', ''), ('timeout error, dev ', ''), ('Buffer I/O error on dev', ''))),
    # fs/xfs/xfs_fsops.c xfs_do_force_shutdown: "Corruption of in-memory data (0x%x) detected ... Shutting down filesystem"
    _p("xfs_shutdown", "FilesystemShutdown", _CRIT, "drain_and_diagnose",
       r"XFS \(\S+\): .*(?:Shutting down filesystem|Filesystem has been shut down)",
       "An XFS filesystem shut itself down after an I/O error or corruption: it fails every operation until remounted.",
       hold=None,
       screen=(('XFS (', 'Shutting down filesystem'), ('XFS (', 'Filesystem has been shut down'))),
)


def _r(name: str, severity: Severity, summary: str, action: str = "none", unknown: bool = False) -> Reason:
    return Reason(name, severity, summary, unknown=unknown, family="Kernel", action=action)


REASONS: tuple[Reason, ...] = (
    *(_r(p.reason, p.severity, p.summary, p.action) for p in PATTERNS),
    _r(OPERATOR_REASON, _WARN, "A pattern of checks.kernel.patterns matched; its severity and action are the ones configured."),
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
