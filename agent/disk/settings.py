"""The ``[checks.disk]`` section."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import CheckConfig, opt


def _absolute(value: str) -> str | None:
    return None if value.startswith("/") else f'expected an absolute path, got "{value}"'


@dataclass(frozen=True)
class DiskConfig(CheckConfig):
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    paths: tuple[str, ...] = opt(("/",), "Mount points to check (host paths); each must be a mount point.", check=_absolute)
    include_state_dir: bool = opt(True, "Also check the filesystem that holds the agent's state dir.")
    write_probe: bool = opt(True, "Create, write, fsync and remove a small probe file on each filesystem.")
    warning_free_percent: float = opt(10.0, "Warn when free space (for ordinary users, as df) is below this.", min=0, max=100)
    critical_free_percent: float = opt(5.0, "Critical when free space is below this.", min=0, max=100)
    inodes_warning_free_percent: float = opt(10.0, "Warn when free inodes are below this.", min=0, max=100)
    inodes_critical_free_percent: float = opt(5.0, "Critical when free inodes are below this.", min=0, max=100)
    probe_timeout: float = opt(
        5.0, "Per path: statfs and the write probe taking longer are reported as DiskProbeHung.", duration=True, min=0.01
    )

    def validate(self) -> tuple[str, str] | None:
        for prefix in ("", "inodes_"):
            warn, crit = getattr(self, f"{prefix}warning_free_percent"), getattr(self, f"{prefix}critical_free_percent")
            if warn > 0 and crit > warn:  # a warning threshold of 0 is off: it orders nothing
                return f"{prefix}critical_free_percent", f"expected at most {prefix}warning_free_percent ({warn:g}), got {crit:g}"
        return None
