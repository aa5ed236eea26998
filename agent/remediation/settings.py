"""The ``[remediation]`` configuration section (issue 12's ladder on the node).

Safe by default: ``mode = "observe"`` computes, logs and exports every step
the ladder would take and does none of them; ``mode = "enforce"`` does only
the steps whose action is switched on in ``actions`` (none by default), so an
operator turns the ladder on one action at a time. The ladder never skips a
step it may not take: a reboot fault without "drain" in ``actions`` on a cluster
waits before the drain (exported as would-be), it does not reboot undrained.

A command named here (the reboot ``command``, ``retire_command``) must exist
when the file is loaded: an operator learns of a typo from the config check
(exit 2), not from a sick node that fails to reboot months later.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..schema import opt

Mode = Literal["observe", "enforce"]
Method = Literal["systemd", "kured", "command"]
Via = Literal["systemctl", "logind"]


def check_argv(argv: Sequence[str]) -> str | None:
    """An operator's command: empty (not set), or an argv whose program exists and is executable."""
    if not argv:
        return None
    prog = argv[0]
    if "/" in prog:
        if not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
            return f'expected an executable program as the first element, "{prog}" does not exist or is not executable'
    elif shutil.which(prog) is None:
        return f'expected an executable program as the first element, "{prog}" is not on PATH ({os.environ.get("PATH", "")})'
    return None


STEPS = ("drain", "reset_gpu", "reboot", "retire")


def check_action(value: str) -> str | None:
    if value not in STEPS:
        return "expected one of " + ", ".join(f'"{s}"' for s in STEPS) + f', got "{value}"'
    return None


@dataclass(frozen=True)
class RebootSection:
    method: Method = opt(
        "systemd",
        'How to reboot: "systemd" (logind Reboot over D-Bus or systemctl reboot), "kured" (write its sentinel '
        'file and let kured lock, drain and reboot), "command" (the argv in command).',
    )
    systemd_via: Via = opt(
        "systemctl",
        '"systemctl": systemctl reboot (as kured does); "logind": busctl call org.freedesktop.login1 ... Reboot b false.',
    )
    host_namespaces: bool = opt(
        False,
        "Run the systemd call through nsenter into PID 1's namespaces (a DaemonSet pod with hostPID and "
        "privileged, as kured does); false: the agent sees the host's systemd and D-Bus itself (bare metal).",
    )
    kured_sentinel: str = opt("/var/run/reboot-required", "Sentinel file kured watches (host path, under paths.rootfs).")
    command: tuple[str, ...] = opt((), 'argv of the operator\'s reboot command (method = "command").')
    min_uptime: float = opt(1800.0, "No reboot sooner than this after the host booted.", duration=True, min=0)
    max_per_day: int = opt(2, "At most this many reboots by the agent in any 24 hours.", min=0, max=24)
    settle: float = opt(
        600.0, "After the boot, the fault must stay away this long before the reboot counts as a cure "
        "(and the disruption slot is released).", duration=True, min=0,
    )
    force_after: float = opt(
        0.0, "Opt-in: when the drain timed out with pods it could not move (on_timeout = \"wait\"), reboot anyway this "
        "long after the drain began; 0 (default): never over pods left on the node (RemediationHeld, subject drain).",
        duration=True, min=0,
    )

    def validate(self) -> tuple[str, str] | None:
        if self.method == "command" and not self.command:
            return "command", 'expected an argv such as ["/usr/local/sbin/reboot-node"] when method = "command"'
        problem = check_argv(self.command)
        if problem:
            return "command", f"{problem}, got {list(self.command)}"
        if not self.kured_sentinel.startswith("/"):
            return "kured_sentinel", f'expected an absolute host path, got "{self.kured_sentinel}"'
        return None


@dataclass(frozen=True)
class GpuResetSection:
    nvidia_smi: str = opt("nvidia-smi", "nvidia-smi to run (a name on PATH or an absolute path).")
    allow_mig: bool = opt(False, "Reset a GPU in MIG mode too (off: a MIG GPU's reset_gpu fault escalates to a reboot).")
    toggle_persistence: bool = opt(
        True, "Turn persistence mode off before the reset and back on after it (a reset with it on fails: "
        '"In use by another client").',
    )
    timeout: float = opt(120.0, "Time limit of each nvidia-smi call.", duration=True, min=1)
    verify_burn: float = opt(
        30.0, "Verify a reset GPU with a burn of this long (agent burn; skipped where no burn backend is present); "
        "0: NVML's view alone.", duration=True, min=0,
    )
    max_per_boot: int = opt(
        1, "At most this many resets of one GPU in one boot, whatever the fault; then its reset faults escalate to "
        "a reboot (a reset of unknown outcome counts).", min=1, max=10,
    )
    busy_timeout: float = opt(
        600.0, "How long processes may stay on the GPU after its drain; then the fault escalates to a reboot.",
        duration=True, min=0,
    )
    force_after: float = opt(
        0.0, "Opt-in: when the drain timed out with pods it could not move (on_timeout = \"wait\"), reset the GPU anyway this "
        "long after the drain began; 0 (default): never over pods left on the node (RemediationHeld, subject drain).",
        duration=True, min=0,
    )


@dataclass(frozen=True)
class RetireSection:
    after_reboots: int = opt(2, "Retire after this many reboots that did not cure the same fault ...", min=1, max=100)
    window: float = opt(7 * 86400.0, "... within this window (GPUd and NVSentinel count repeat offenders so).", duration=True, min=3600)
    command: tuple[str, ...] = opt((), "argv run once when the node is retired (e.g. open a ticket); empty: none.")
    power_off_after: float = opt(
        0.0, "Power the retired node off this long after retiring it (a VM scale set replaces a stopped instance); "
        "0: never.", duration=True, min=0,
    )
    force_after: float = opt(
        0.0, "Opt-in: when the drain timed out with pods it could not move (on_timeout = \"wait\"), retire anyway this "
        "long after the drain began; 0 (default): never over pods left on the node (RemediationHeld, subject drain).",
        duration=True, min=0,
    )

    def validate(self) -> tuple[str, str] | None:
        problem = check_argv(self.command)
        return ("command", f"{problem}, got {list(self.command)}") if problem else None


@dataclass(frozen=True)
class RemediationSection:
    mode: Mode = opt(
        "observe", '"observe": compute, log and export every step (node_health_remediation_would), do none; '
        '"enforce": do the steps whose action is enabled below.',
    )
    actions: tuple[str, ...] = opt(
        (), 'The steps "enforce" may take: any of "drain", "reset_gpu", "reboot", "retire" (none by default: turn them '
        "on one at a time). A step not listed is exported as would-be and the ladder waits there.",
        check=check_action,
    )
    reset_gpu_after: float = opt(120.0, "A reset_gpu finding must stand this long before the ladder starts.", duration=True, min=0)
    reboot_after: float = opt(600.0, "A reboot finding must stand this long before the ladder starts.", duration=True, min=0)
    drain_after: float = opt(600.0, "A drain_and_diagnose finding must stand this long before the node is drained.", duration=True, min=0)
    rma_after: float = opt(600.0, "An rma finding must stand this long before the node is drained and retired.", duration=True, min=0)
    interval: float = opt(10.0, "The ladder looks at its work at least this often (and at once on a new finding).", duration=True, min=1, max=600)
    command_timeout: float = opt(120.0, "Time limit of a reboot, retire or power-off command.", duration=True, min=1)
    reboot: RebootSection = field(default_factory=RebootSection, metadata={"doc": "How and how often to reboot."})
    gpu_reset: GpuResetSection = field(default_factory=GpuResetSection, metadata={"doc": "Resetting one GPU."})
    retire: RetireSection = field(default_factory=RetireSection, metadata={"doc": "When and how to retire the node."})

    def allows(self, step: str) -> bool:
        """Whether "enforce" may do this step (observe never does)."""
        return self.mode == "enforce" and step in self.actions
