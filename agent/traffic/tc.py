"""tc over rtnetlink (pyroute2): the agent's HTB qdisc on an uplink, one class per shaped pod.

pyroute2 is imported here, inside `Tc`, only when shaping is enabled (or when a
root qdisc of ours is to be given back): importing it costs ~24 MB of RSS.

What is ours on a device: the root qdisc whose handle is ``<major>:`` (the
configured ``qdisc_major``) and kind ``htb``, and everything under it. A root
qdisc the kernel made by default has handle ``0:`` (``mq``, ``fq_codel``,
``pfifo_fast``, ``noqueue``); that is the only root we take over, by replacing
it, and we give it back by deleting ours: the kernel then attaches its default
again (``dev_activate`` → ``attach_default_qdiscs``). A root qdisc anyone else
made (any other handle or kind) is never touched.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

TC_H_ROOT = 0xFFFFFFFF
# Each class's queue, the first the kernel has: flows share the class fairly, CoDel keeps the queue short.
# A kernel with neither (CONFIG_NET_SCH_FQ_CODEL and _FQ off) keeps HTB's own pfifo leaf.
LEAVES = ("fq_codel", "fq")
MIN_BURST = 64 * 1024  # one GSO/TSO super-packet


_UNKNOWN_KINDS: set[str] = set()  # leaf kinds this kernel refused, for the life of the process


class TcError(Exception):
    """Netlink refused or could not answer; the message says what and where."""


@dataclass(frozen=True, slots=True)
class Root:
    kind: str
    handle: int  # 0: the kernel's default root

    @property
    def default(self) -> bool:
        return self.handle == 0


@dataclass(frozen=True, slots=True)
class ClassState:
    minor: int
    rate: int  # bits per second
    ceil: int
    bytes: int
    packets: int
    leaf: str  # kind of the qdisc under the class ("" when none)
    leaf_drops: int
    drops: int  # drops the HTB class itself counted


@dataclass(frozen=True, slots=True)
class DeviceState:
    index: int
    root: Root | None  # None: the device has no root qdisc (cannot happen for an up device, but be safe)
    classes: dict[int, ClassState]  # minor -> class, only under our root (empty when the root is not ours)

    def ours(self, major: int) -> bool:
        return self.root is not None and self.root.kind == "htb" and self.root.handle == major << 16


def burst_bytes(rate_bits: int) -> int:
    """HTB bucket size: at least one GSO super-packet, and 4 ms at the rate (a 250 Hz timer tick)."""
    return max(MIN_BURST, rate_bits // 8 // 250)


def _attr(msg: Any, *path: str) -> Any:
    for name in path:
        if msg is None:
            return None
        msg = msg.get_attr(name)
    return msg


def _netlink_error(exc: BaseException, what: str) -> TcError:
    code = getattr(exc, "code", None)
    text = errno.errorcode.get(code, str(code)) if isinstance(code, int) else str(exc)
    return TcError(f"{what}: {text} ({exc})")


class Tc:
    """One netlink socket for one run; a context manager so it is always closed."""

    def __init__(self) -> None:
        try:
            from pyroute2 import IPRoute  # type: ignore[import-untyped]
        except ImportError as exc:
            raise TcError(f"pyroute2 is not installed ({exc})") from None
        try:
            self._ipr: Any = IPRoute(groups=0)
        except OSError as exc:
            raise TcError(f"cannot open a netlink socket: {exc.strerror or exc}") from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._ipr.close()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - NetlinkError, OSError: one error type for the caller
            raise _netlink_error(exc, what) from None

    # ------------------------------------------------------------ devices

    def index(self, name: str) -> int | None:
        found = self._call(f"looking up {name}", self._ipr.link_lookup, ifname=name)
        return int(found[0]) if found else None

    def default_route_devices(self) -> list[str]:
        """Names of the devices the default routes (IPv4 and IPv6, main table) leave through."""
        out: list[str] = []
        for family in (2, 10):  # AF_INET, AF_INET6
            for route in self._call("reading the default routes", self._ipr.get_default_routes, family=family):
                indices = [route.get_attr("RTA_OIF")]
                multipath = route.get_attr("RTA_MULTIPATH") or []
                indices += [hop["oif"] for hop in multipath]
                for idx in indices:
                    if idx is None:
                        continue
                    links = self._call("reading a link", self._ipr.get_links, idx)
                    name = links[0].get_attr("IFLA_IFNAME") if links else None
                    if name and name not in out:
                        out.append(name)
        return out

    def names(self) -> list[tuple[int, str]]:
        """(index, name) of every link."""
        links = self._call("listing links", self._ipr.get_links)
        return [(int(link["index"]), str(link.get_attr("IFLA_IFNAME"))) for link in links]

    # ------------------------------------------------------------ reading

    def read(self, index: int, major: int) -> DeviceState:
        qdiscs = self._call("listing qdiscs", self._ipr.get_qdiscs, index)
        root: Root | None = None
        leaves: dict[int, tuple[str, int]] = {}
        for q in qdiscs:
            if q["index"] != index:
                continue
            kind = q.get_attr("TCA_KIND") or ""
            if q["parent"] == TC_H_ROOT:
                root = Root(kind, q["handle"])
            elif q["parent"] >> 16 == major:
                leaves[q["parent"] & 0xFFFF] = (kind, _drops(q))
        state = DeviceState(index, root, {})
        if not state.ours(major):
            return state
        for c in self._call("listing classes", self._ipr.get_classes, index):
            handle = c["handle"]
            if c["index"] != index or handle >> 16 != major or handle & 0xFFFF == 0:
                continue
            parms = _attr(c, "TCA_OPTIONS", "TCA_HTB_PARMS")
            opts = c.get_attr("TCA_OPTIONS")
            rate = (opts.get_attr("TCA_HTB_RATE64") if opts is not None else None) or (parms["rate"] if parms else 0)
            ceil = (opts.get_attr("TCA_HTB_CEIL64") if opts is not None else None) or (parms["ceil"] if parms else 0)
            basic = _attr(c, "TCA_STATS2", "TCA_STATS_BASIC")
            minor = handle & 0xFFFF
            leaf, leaf_drops = leaves.get(minor, ("", 0))
            state.classes[minor] = ClassState(
                minor, rate * 8, ceil * 8, basic["bytes"] if basic else 0, basic["packets"] if basic else 0,
                leaf, leaf_drops, _drops(c),
            )
        return state

    # ------------------------------------------------------------ changing

    def take_root(self, index: int, major: int) -> None:
        """Replace the kernel's default root qdisc with our HTB (unclassified packets: its direct queue)."""
        self._call(f"installing htb {major:x}: as the root qdisc", self._ipr.tc, "replace", "htb", index, major << 16,
                   parent=TC_H_ROOT, default=0)

    def give_back(self, index: int, major: int) -> None:
        """Delete our root qdisc: the kernel attaches its default root again."""
        try:
            self._ipr.tc("del", "htb", index, major << 16, parent=TC_H_ROOT)
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "code", None) in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
                return  # already gone
            raise _netlink_error(exc, f"deleting htb {major:x}:") from None

    def set_class(self, index: int, major: int, minor: int, rate_bits: int, *, exists: bool) -> None:
        rate = rate_bits // 8
        burst = burst_bytes(rate_bits)
        self._call(f"{'changing' if exists else 'adding'} class {major:x}:{minor:x}", self._ipr.tc,
                   "change-class" if exists else "add-class", "htb", index, major << 16 | minor,
                   parent=major << 16, rate=rate, ceil=rate, burst=burst, cburst=burst, quantum=_quantum(rate))

    def set_leaf(self, index: int, major: int, minor: int, kinds: tuple[str, ...] = LEAVES) -> str:
        """The first of `kinds` the kernel knows, as the qdisc under the class (handle <minor>:, replacing what
        is there); the kind used, or "" when the kernel knows none of them (the class keeps HTB's pfifo)."""
        for kind in kinds:
            if kind in _UNKNOWN_KINDS:
                continue
            try:
                self._ipr.tc("replace", kind, index, minor << 16, parent=major << 16 | minor)
                return kind
            except Exception as exc:  # noqa: BLE001
                # The parent class was just put in place: ENOENT is the kernel not knowing the kind.
                if getattr(exc, "code", None) != errno.ENOENT:
                    raise _netlink_error(exc, f"adding {kind} under {major:x}:{minor:x}") from None
                _UNKNOWN_KINDS.add(kind)
        return ""

    def delete_class(self, index: int, major: int, minor: int) -> None:
        try:
            self._ipr.tc("del-class", None, index, major << 16 | minor, parent=major << 16)  # htb would want a rate
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "code", None) == errno.ENOENT:
                return
            raise _netlink_error(exc, f"deleting class {major:x}:{minor:x}") from None


def give_back_everywhere(major: int) -> list[str]:
    """Give back every root qdisc of ours (htb <major>:), on any device: the names of those given back."""
    out = []
    with Tc() as tc:
        for index, name in tc.names():
            if tc.read(index, major).ours(major):
                tc.give_back(index, major)
                out.append(name)
    return out


def _drops(msg: Any) -> int:
    queue = _attr(msg, "TCA_STATS2", "TCA_STATS_QUEUE")
    if queue is not None:
        return int(queue["drops"])
    old = msg.get_attr("TCA_STATS")
    return int(old["drops"]) if old is not None else 0


def _quantum(rate_bytes: int) -> int:
    """Bytes a class may send per round when it borrows: rate/10 (HTB's r2q) kept within 1500..200000 so
    the kernel does not warn about it."""
    return min(200_000, max(1500, rate_bytes // 10))
