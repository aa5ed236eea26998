"""The ``[checks.kernel]`` section: the kernel-log fault table and its
operator changes, and the EDAC memory-error counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..catalog import Reason
from ..findings import ACTIONS, Severity
from ..schema import CheckConfig, opt, parse_duration
from .catalog import PATTERNS, FaultPattern, operator_reasons, reason_problem
from .patterns import NAME, PatternError, Table, check_regex, merged

SEVERITIES = ("info", "warning", "critical")
BUILTIN = frozenset(p.name for p in PATTERNS)


def _hold(value: str) -> str | None:
    if value in ("", "boot"):
        return None
    try:
        parse_duration(value)
    except ValueError:
        return f'expected a duration such as "30m" or "boot" (until the node reboots), got "{value}"'
    return None


@dataclass(frozen=True)
class PatternConfig:
    """One entry of ``[checks.kernel.patterns.<name>]``: a new pattern, or
    changes to the built-in pattern of that name (unset keys keep its values)."""

    pattern: str = opt("", "Regular expression (Python syntax) matched at the start of a kernel message.")
    reason: str = opt(
        "", 'Reason of the finding, CamelCase (e.g. "TaskHung"): the node condition\'s reason and the taint\'s value; '
        'a reason of the fault table or one of its own (new patterns: "KernelLogPattern").'
    )
    severity: str = opt("", 'Severity of the finding: "info", "warning" or "critical" (new patterns: warning).')
    action: str = opt("", 'Recommended action: none, restart_app, reset_gpu, reboot, drain_and_diagnose, rma (new patterns: none).')
    threshold: int = opt(0, "Matches within window that raise the finding (new patterns: 1).", min=0)
    window: float = opt(0.0, 'Window the threshold counts matches in (new patterns: "10m").', duration=True, min=0)
    hold: str = opt("", 'How long the finding stays after the last match, or "boot": until the node reboots (new patterns: "1h").', check=_hold)

    def fields(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.pattern:
            out["pattern"] = self.pattern
        if self.reason:
            out["reason"] = self.reason
        if self.severity:
            out["severity"] = Severity(self.severity)
        if self.action:
            out["action"] = self.action
        if self.threshold:
            out["threshold"] = self.threshold
        if self.window:
            out["window"] = self.window
        if self.hold:
            out["hold"] = None if self.hold == "boot" else parse_duration(self.hold)
        return out


@dataclass(frozen=True)
class KernelConfig(CheckConfig):
    interval: float = opt(60.0, "Time between reads of the EDAC memory-error counts.", duration=True, min=1)
    timeout: float = opt(30.0, "A run longer than this is reported as CheckTimeout.", duration=True, min=0.1)
    log_faults: bool = opt(True, "Follow the kernel log for the faults of the pattern table (hung tasks, lockups, oops, MCE, mlx5, NVMe, ...).")
    kmsg_path: str = opt(
        "/dev/kmsg",
        "Kernel log to follow (host path); the same path as checks.gpu.kmsg_path shares one reader.",
    )
    disable: tuple[str, ...] = opt((), "Built-in patterns not to match (by name, e.g. \"memcg_oom_kill\").")
    patterns: Mapping[str, PatternConfig] = opt(
        MappingProxyType({}),
        "Patterns added, or built-in ones changed, by name: [checks.kernel.patterns.<name>] with pattern, reason, "
        "severity, action, threshold, window, hold.",
    )
    edac: bool = opt(True, "Read the EDAC memory-error counts (/sys/devices/system/edac/mc).")
    edac_ce_per_day: float = opt(
        10.0, "Corrected memory errors per memory controller or DIMM in 24 h at or above which EdacCorrectedRate is raised; 0: never.", min=0
    )

    def validate(self) -> tuple[str, str] | None:
        for i, name in enumerate(self.disable):
            if name not in BUILTIN:
                return f"disable[{i}]", f'expected the name of a built-in pattern (see "agent docs patterns"), got "{name}"'
        for name, p in self.patterns.items():
            problem = _entry(name, p)
            if problem:
                return f"patterns.{name}.{problem[0]}" if problem[0] else f"patterns.{name}", problem[1]
        return None

    def table(self) -> Table:
        return Table(self.merged())

    def merged(self) -> list[FaultPattern]:
        """The patterns the table is made of (no regex compiled for matching, no screen built)."""
        return merged(((name, p.fields()) for name, p in self.patterns.items()), self.disable)

    def reasons(self) -> list[tuple[str, Reason]]:
        """The reasons the operator's patterns name that the kernel catalog lacks, each with the key of
        the first pattern naming it (`agent.registry.configured_reasons`)."""
        if not any(p.reason for p in self.patterns.values()):
            return []
        first: dict[str, str] = {}
        for name, p in self.patterns.items():
            if p.reason:
                first.setdefault(p.reason, f"patterns.{name}.reason")
        return [(first[r.name], r) for r in operator_reasons(self.merged())]


def _entry(name: str, p: PatternConfig) -> tuple[str, str] | None:
    if not NAME.fullmatch(name):
        return "", f'expected a name of lowercase letters, digits and "_", got "{name}"'
    if name not in BUILTIN and not p.pattern:
        return "pattern", f'expected a regular expression ("{name}" is not a built-in pattern)'
    if p.pattern:
        problem = check_regex(p.pattern)
        if problem:
            return "pattern", problem
    if p.reason:
        problem = reason_problem(p.reason)
        if problem:
            return "reason", problem
    if p.severity and p.severity not in SEVERITIES:
        return "severity", f'expected one of "info", "warning", "critical", got "{p.severity}"'
    if p.action and p.action not in ACTIONS:
        return "action", "expected one of " + ", ".join(f'"{a}"' for a in ACTIONS) + f', got "{p.action}"'
    try:
        merged([(name, p.fields())])
    except PatternError as exc:  # pragma: no cover - the checks above say it first
        return "pattern", str(exc)
    return None
