"""The ``[checks.infiniband]`` section."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import CheckConfig, opt

# The hw_counters read by default (mlx5 names; a driver without one simply lacks the file):
# transport retries and sequence errors that NVSentinel's NIC monitor watches.
DEFAULT_HW_COUNTERS = (
    "rnr_nak_retry_err",
    "local_ack_timeout_err",
    "req_transport_retries_exceeded",
    "roce_slow_restart",
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
)


def _glob(value: str) -> str | None:
    if not value or value.strip() != value or value.count("/") > 1:
        return f'expected a device glob ("mlx5_*") or "device/port" ("mlx5_0/1"), got "{value}"'
    return None


def _counter_name(value: str) -> str | None:
    if not value or "/" in value or value.startswith(".") or not value.isprintable() or " " in value:
        return f'expected a counter file name ("rnr_nak_retry_err"), got "{value}"'
    return None


@dataclass(frozen=True)
class InfinibandConfig(CheckConfig):
    interval: float = opt(30.0, "Time between runs.", duration=True, min=1)
    include: tuple[str, ...] = opt(
        (), 'Ports to watch: globs on the device ("mlx5_*") or "device/port" ("mlx5_0/1"). Empty: all.', check=_glob
    )
    exclude: tuple[str, ...] = opt(
        (), "Ports not to watch at all (globs as in include): not read, not judged, not exported.", check=_glob
    )
    counters_exclude: tuple[str, ...] = opt(
        (),
        "Ports whose counters/ and hw_counters/ are never read (globs as in include): firmware-restricted "
        "functions whose counter reads log ACCESS_REG errors. State and rate are still read and judged.",
        check=_glob,
    )
    hw_counters: tuple[str, ...] = opt(
        DEFAULT_HW_COUNTERS, "hw_counters/ files read and exported (driver-specific names); [] reads none.",
        check=_counter_name,
    )
    expected_ports: int = opt(
        0, "Watched ports that must be ACTIVE; fewer is IbPortsMissing. 0: no count (homogeneity still applies).", min=0
    )
    min_rate_gbps: float = opt(
        0.0, "An ACTIVE port below this rate (Gb/s) is IbPortRateLow. 0: compare with its peers of the same model.", min=0
    )
    drop_after: float = opt(
        240.0, "A port down (not INIT/ARMED) this long is IbPortDropped; shorter, IbPortDown.", duration=True, min=0
    )
    flap_window: float = opt(43200.0, "Window in which a port's down events are counted.", duration=True, min=60)
    flap_threshold: int = opt(3, "This many down events within flap_window is IbPortFlapping.", min=1)
    fatal_window: float = opt(
        3600.0,
        "An increase of link_downed, local_link_integrity_errors or excessive_buffer_overrun_errors is a finding "
        "for this long after it was seen.",
        duration=True,
        min=60,
    )
    symbol_error_limit: int = opt(
        120, "symbol_error increase within symbol_error_window above this is IbSymbolErrors; 0 turns it off.", min=0
    )
    symbol_error_window: float = opt(3600.0, "Window of symbol_error_limit.", duration=True, min=60)
    rcv_error_limit: int = opt(
        3000, "port_rcv_errors increase within rcv_error_window above this is IbReceiveErrors; 0 turns it off.", min=0
    )
    rcv_error_window: float = opt(300.0, "Window of rcv_error_limit.", duration=True, min=60)
    link_error_recovery_limit: int = opt(
        25,
        "link_error_recovery increase within link_error_recovery_window above this is IbLinkErrorRecovery; "
        "0 turns it off.",
        min=0,
    )
    link_error_recovery_window: float = opt(300.0, "Window of link_error_recovery_limit.", duration=True, min=60)
