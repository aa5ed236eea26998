"""Link state over rtnetlink (pyroute2), and the default set of interfaces.

pyroute2 is imported here, inside `LinkReader`, only when the network check
runs: any import from the package (even ``pyroute2.iproute.linux``) executes
its ``__init__``, which loads every module it has (~24 MB of RSS, ~0.25 s).
"""

from __future__ import annotations

import errno
import logging
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ..hostpaths import HostPaths, read_text
from ..state import StateDir, StateFile, boot_id, obj, text, texts

log = logging.getLogger(__name__)

# RFC 2863 operational states as the kernel names them (IF_OPER_*), see
# https://docs.kernel.org/networking/operstates.html
OPERSTATES: tuple[str, ...] = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
# Drivers that do not track operstate report "unknown" for a working link (lo, many virtual devices).
PASSING = frozenset({"up", "unknown"})

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFNAMSIZ = 16

REMEMBERED = "network-interfaces.json"


class LinkError(Exception):
    """Netlink could not answer (no socket, an error other than "no such device")."""


@dataclass(frozen=True, slots=True)
class LinkState:
    name: str
    index: int
    admin_up: bool
    carrier: bool
    operstate: str
    carrier_changes: int | None  # IFLA_CARRIER_CHANGES (Linux >= 3.15): up and down transitions since creation

    @property
    def passing(self) -> bool:
        return self.admin_up and self.carrier and self.operstate in PASSING


def interface_name(value: str) -> str | None:
    """Config validator: a name the kernel accepts (net/core/dev.c `dev_valid_name`)."""
    ok = 0 < len(value.encode()) < IFNAMSIZ and value not in (".", "..")
    if ok and not any(c == "/" or c == ":" or c.isspace() for c in value):
        return None
    return f'expected an interface name (1-15 bytes, no "/", ":" or spaces), got "{value}"'


class LinkReader:
    """One netlink socket for one run; use as a context manager so it is always closed."""

    def __init__(self) -> None:
        try:
            from pyroute2 import IPRoute  # type: ignore[import-untyped]
        except ImportError as exc:
            raise LinkError(f"pyroute2 is not installed ({exc})") from None
        try:
            # groups=0: a request socket, not subscribed to link/address/route events.
            self._ipr: Any = IPRoute(groups=0)
        except OSError as exc:
            raise LinkError(f"cannot open a netlink socket: {exc.strerror or exc}") from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._ipr.close()

    def get(self, name: str) -> LinkState | None:
        """The link's state; None when the kernel has no link of that name."""
        from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]

        try:
            msg = self._ipr.link("get", ifname=name)[0]
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:
                return None
            raise LinkError(f"RTM_GETLINK {name}: {os.strerror(exc.code) if exc.code else exc}") from None
        except OSError as exc:
            raise LinkError(f"RTM_GETLINK {name}: {exc.strerror or exc}") from None
        return _state(name, msg)


def _state(name: str, msg: Any) -> LinkState:
    flags = int(msg["flags"])
    carrier = msg.get("IFLA_CARRIER")
    operstate = str(msg.get("IFLA_OPERSTATE") or "unknown").lower()
    changes = msg.get("IFLA_CARRIER_CHANGES")
    return LinkState(
        name=name,
        index=int(msg["index"]),
        admin_up=bool(flags & IFF_UP),
        # IFLA_CARRIER is missing on kernels older than 3.8: IFF_LOWER_UP says the same.
        carrier=bool(carrier) if carrier is not None else bool(flags & IFF_LOWER_UP),
        operstate=operstate if operstate in OPERSTATES else "unknown",
        carrier_changes=int(changes) if changes is not None else None,
    )


class FlapWindow:
    """Carrier changes of one link within a sliding time window. A window (rather
    than the change between two runs) keeps a link that bounces every 20 s flagged
    steadily when the check runs every 15 s, instead of flagged every other run."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._seen: deque[tuple[float, int, int]] = deque()  # (time, ifindex, carrier changes)

    def changes(self, now: float, index: int, total: int) -> int:
        """Carrier changes within the window, this sample included."""
        if self._seen and (self._seen[-1][1] != index or total < self._seen[-1][2]):
            self._seen.clear()  # the link was re-created: its counter started again
        self._seen.append((now, index, total))
        # keep one sample at or before the window's start: the baseline of the count
        while len(self._seen) > 1 and self._seen[1][0] <= now - self.window:
            self._seen.popleft()
        return total - self._seen[0][2]


def in_sysfs(paths: HostPaths, name: str) -> bool:
    return os.path.lexists(paths.sys("class/net", name))


def speed(paths: HostPaths, name: str) -> int | None:
    """Negotiated speed in Mb/s; None when unknown (link down gives EINVAL, virtual devices -1)."""
    text = read_text(paths.sys("class/net", name, "speed"))
    if text is None or not text.isdigit():
        return None
    return int(text) or None


def physical(paths: HostPaths) -> list[str]:
    """Interfaces backed by a device (PCI, virtio, …): /sys/class/net/<if>/device exists.
    Bridges, bonds, VLANs, veths and tunnels have no `device`."""
    try:
        names = os.listdir(paths.sys("class/net"))
    except OSError as exc:
        log.warning("cannot list %s: %s", paths.sys("class/net"), exc.strerror or exc)
        return []
    return sorted(n for n in names if os.path.lexists(paths.sys("class/net", n, "device")))


def discover(paths: HostPaths, state_dir: str) -> tuple[str, ...]:
    """The default interfaces: physical ones that are up with carrier now, plus the
    ones an earlier start in this boot chose, so a restart during an outage does
    not drop the very link that is down. Raises LinkError."""
    with LinkReader() as reader:
        up = [n for n in physical(paths) if (s := reader.get(n)) is not None and s.admin_up and s.carrier]
    boot = boot_id(paths)
    earlier = _remembered(state_dir, boot)
    chosen = tuple(sorted(set(up) | earlier))
    if boot and set(chosen) != earlier:
        _remember(state_dir, boot, chosen)
    return chosen


def _parse_remembered(raw: Any) -> tuple[str, set[str]]:
    d = obj(raw)
    return text(d["boot_id"], "boot_id"), set(texts(d["interfaces"], "interfaces"))


REMEMBERED_FILE = StateFile(REMEMBERED, _parse_remembered)


def _remembered(state_dir: str, boot: str) -> set[str]:
    if not boot or not os.path.isdir(state_dir):
        return set()
    data = StateDir(state_dir).load(REMEMBERED_FILE)
    if data is None or data[0] != boot:
        return set()
    return {n for n in data[1] if interface_name(n) is None}


def _remember(state_dir: str, boot: str, names: Iterable[str]) -> None:
    if not os.path.isdir(state_dir):
        return  # `agent selftest` without the daemon's state dir: nothing to keep
    try:
        StateDir(state_dir).write_json(REMEMBERED, {"boot_id": boot, "interfaces": list(names)})
    except OSError as exc:
        log.warning("cannot remember the watched interfaces in %s: %s", state_dir, exc.strerror or exc)
