"""Link state over rtnetlink, and the default set of interfaces.

`LinkReader` sends ``RTM_GETLINK`` on a plain ``AF_NETLINK`` socket and reads
the five fields the check uses from the answer (flags, index, ``IFLA_CARRIER``,
``IFLA_OPERSTATE``, ``IFLA_CARRIER_CHANGES``). It used pyroute2 before issue 29:
any import from that package (even ``pyroute2.iproute.linux``, with the package
``__init__`` skipped) loads asyncio, sqlite3 and unittest.mock with it
(+20.9 MB of RSS for ``from pyroute2 import IPRoute``, +14.8 MB for
``pyroute2.iproute.linux`` alone; this module: nothing beyond the stdlib the
agent holds). `tests/network/test_network_links.py` holds the answers equal to
pyroute2's for the same links.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ..hostpaths import HostPaths, read_text
from ..statedir import StateDir, StateFile, boot_id, obj, text, texts

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


# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h)
NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_GETLINK = 18
NLM_F_REQUEST = 0x1
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
IFLA_CARRIER = 33
IFLA_CARRIER_CHANGES = 35
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
IFINFOMSG = struct.Struct("=BxHiII")  # family, pad, type, index, flags, change
RTATTR = struct.Struct("=HH")  # len, type
RECV_BUFFER = 65536  # one link's answer is ~1.5 KB (no IFLA_EXT_MASK: no VF lists)
TIMEOUT = 5.0  # the kernel answers at once; a bound, not a wait


class LinkReader:
    """One netlink socket for one run; use as a context manager so it is always closed.
    A request socket (bound to no multicast group): not subscribed to link events."""

    def __init__(self) -> None:
        try:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        except OSError as exc:
            raise LinkError(f"cannot open a netlink socket: {exc.strerror or exc}") from None
        try:
            self._sock.bind((0, 0))
            self._sock.settimeout(TIMEOUT)
        except OSError as exc:
            self._sock.close()
            raise LinkError(f"cannot open a netlink socket: {exc.strerror or exc}") from None
        self._seq = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._sock.close()

    def get(self, name: str) -> LinkState | None:
        """The link's state; None when the kernel has no link of that name."""
        self._seq += 1
        try:
            self._sock.send(request(name, self._seq))
            while True:
                data = self._sock.recv(RECV_BUFFER)
                answer = parse_answer(data, self._seq)
                if answer is not None:
                    break
        except OSError as exc:  # socket.timeout included
            raise LinkError(f"RTM_GETLINK {name}: {exc.strerror or exc or 'no answer'}") from None
        if isinstance(answer, int):
            if answer == errno.ENODEV:
                return None
            raise LinkError(f"RTM_GETLINK {name}: {os.strerror(answer)}")
        return _state(name, answer)


def request(name: str, seq: int) -> bytes:
    """RTM_GETLINK for one interface by name (ifi_index 0: the kernel looks the name up)."""
    raw = name.encode() + b"\0"
    attr = RTATTR.pack(RTATTR.size + len(raw), IFLA_IFNAME) + raw
    attr += b"\0" * (-len(attr) % 4)
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETLINK, NLM_F_REQUEST, seq, 0) + body


def parse_answer(data: bytes, seq: int) -> dict[str, int] | int | None:
    """The answer to request `seq` in one datagram: the link's fields (``flags``, ``index`` and the
    ``IFLA_*`` attributes the check reads, by name), or a positive errno; None when the datagram holds
    no answer to `seq` (an older request's). Malformed input raises OSError (EBADMSG)."""
    off = 0
    while off + NLMSGHDR.size <= len(data):
        length, kind, _flags, mseq, _pid = NLMSGHDR.unpack_from(data, off)
        if length < NLMSGHDR.size or off + length > len(data):
            raise OSError(errno.EBADMSG, "a truncated netlink message")
        body, off = data[off + NLMSGHDR.size:off + length], off + ((length + 3) & ~3)
        if mseq != seq or kind == NLMSG_DONE:
            continue
        if kind == NLMSG_ERROR:
            if len(body) < 4:
                raise OSError(errno.EBADMSG, "a truncated netlink error")
            code = -struct.unpack_from("=i", body)[0]
            return code if code > 0 else None  # 0 is an acknowledgement, not our answer
        if kind == RTM_NEWLINK and len(body) >= IFINFOMSG.size:
            return _link_fields(body)
    return None


def _link_fields(body: bytes) -> dict[str, int]:
    _family, _type, index, flags, _change = IFINFOMSG.unpack_from(body)
    out = {"index": index, "flags": flags}
    off = IFINFOMSG.size
    while off + RTATTR.size <= len(body):
        length, kind = RTATTR.unpack_from(body, off)
        if length < RTATTR.size or off + length > len(body):
            break
        kind &= NLA_TYPE_MASK
        value = body[off + RTATTR.size:off + length]
        if kind in (IFLA_OPERSTATE, IFLA_CARRIER) and len(value) >= 1:
            out["IFLA_OPERSTATE" if kind == IFLA_OPERSTATE else "IFLA_CARRIER"] = value[0]
        elif kind == IFLA_CARRIER_CHANGES and len(value) >= 4:
            out["IFLA_CARRIER_CHANGES"] = struct.unpack_from("=I", value)[0]
        off += (length + 3) & ~3
    return out


def _state(name: str, msg: dict[str, int]) -> LinkState:
    flags = msg["flags"]
    carrier = msg.get("IFLA_CARRIER")
    oper = msg.get("IFLA_OPERSTATE")
    changes = msg.get("IFLA_CARRIER_CHANGES")
    return LinkState(
        name=name,
        index=msg["index"],
        admin_up=bool(flags & IFF_UP),
        # IFLA_CARRIER is missing on kernels older than 3.8: IFF_LOWER_UP says the same.
        carrier=bool(carrier) if carrier is not None else bool(flags & IFF_LOWER_UP),
        operstate=OPERSTATES[oper] if oper is not None and oper < len(OPERSTATES) else "unknown",
        carrier_changes=changes,
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
