"""The ``[checks.network]`` section."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import CheckConfig, format_duration, opt
from .links import interface_name
from .reach import target


@dataclass(frozen=True)
class NetworkConfig(CheckConfig):
    interval: float = opt(15.0, "Time between runs.", duration=True, min=1)
    interfaces: tuple[str, ...] = opt(
        (),
        "Interfaces to watch. Empty: the physical ones (with /sys/class/net/<if>/device) that are up with "
        "carrier when the agent starts, remembered in the state dir until the next boot.",
        check=interface_name,
    )
    flap_window: float = opt(300.0, "Window over which carrier changes are counted.", duration=True, min=1)
    flap_threshold: int = opt(
        2, "More carrier changes than this within flap_window is LinkFlapping (one bounce is 2 changes).", min=0
    )
    error_rate_warning: float = opt(1.0, "rx+tx errors per second that raise LinkErrors; 0 turns it off.", min=0)
    drop_rate_warning: float = opt(
        100.0, "rx+tx drops per second that raise LinkDrops; 0 turns it off (benign rx drops are common).", min=0
    )
    targets: tuple[str, ...] = opt(
        (),
        'TCP targets, "host:port" ("[::1]:443" for IPv6). Empty: the Kubernetes API server '
        "($KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT) when running in a pod, else none.",
        check=target,
    )
    connect_timeout: float = opt(
        3.0, "Budget for name resolution plus TCP connect of one target.", duration=True, min=0.05
    )
    connect_interval: float = opt(
        60.0,
        "Probe targets at most this often (one connection per node per interval); 0: every run.",
        duration=True,
        min=0,
    )

    def validate(self) -> tuple[str, str] | None:
        if self.connect_timeout + 1 > self.timeout:
            most = format_duration(max(self.timeout - 1, 0))
            return (
                "connect_timeout",
                f'expected at most timeout minus 1s ("{most}"), got "{format_duration(self.connect_timeout)}"',
            )
        return None
