"""Reading /sys/class/infiniband: devices, their ports, and the ports' counters.

Formats (linux ``drivers/infiniband/core/sysfs.c``): ``state`` and
``phys_state`` are ``"<n>: <NAME>"`` (``4: ACTIVE``, ``5: LinkUp``), ``rate``
is ``"<Gb/s> Gb/sec (<width>X <speed>)"`` (``400 Gb/sec (4X NDR)``, ``2.5`` for
SDR), ``link_layer`` is ``InfiniBand``, ``Ethernet`` (RoCE) or ``Unknown``;
counters are decimal, or ``N/A (no PMA)`` when the management datagram failed
(node_exporter#966). Reading a counter on a firmware-restricted mlx5 function
(DGX, GB200) fails with EINVAL and logs ``ACCESS_REG ... failed`` in the
kernel log on every read (node_exporter#3434, gpud#1164): such a file is
remembered by the caller and never read again this boot.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..hostpaths import HostPaths

# counters/ files read: the IBTA PortCounters (errors) and the data counters. Widths in bits
# (the kernel's table; the error counters saturate at 2^bits - 1, they do not wrap).
ERROR_COUNTERS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
COUNTERS = (*ERROR_COUNTERS, *DATA_COUNTERS)

ACTIVE, LINK_UP, DISABLED = 4, 5, 3
INIT_STATES = (2, 3)  # INIT, ARMED: the link trained, the subnet manager has not activated the port


@dataclass(frozen=True, slots=True)
class Port:
    device: str
    number: int
    state: tuple[int, str] | None  # ("4", "ACTIVE") as numbers and names; None: unreadable
    phys: tuple[int, str] | None
    rate_gbps: float | None
    link_layer: str
    counters: dict[str, int] = field(default_factory=dict)  # counters/ and hw_counters/ by file name
    problems: tuple[str, ...] = ()  # what could not be read or parsed

    @property
    def name(self) -> str:
        return f"{self.device}/{self.number}"

    @property
    def active(self) -> bool:
        return self.state is not None and self.state[0] == ACTIVE and self.phys is not None and self.phys[0] == LINK_UP


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    board_id: str
    hca_type: str
    fw_ver: str
    ports: tuple[Port, ...]

    @property
    def model(self) -> str:
        """What "the same HCA model" means for homogeneity: the board id (PSID), else the HCA type."""
        return self.board_id or self.hca_type or "unknown"


# ---------------------------------------------------------------- parsing (pure)


def parse_state(text: str) -> tuple[int, str] | None:
    """``"4: ACTIVE"`` → ``(4, "ACTIVE")``; None for anything else."""
    num, sep, name = text.strip().partition(":")
    if not sep or ":" in name or not num.strip().isdigit():
        return None
    return int(num), name.strip()


def parse_rate(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` → 400.0, ``"2.5 Gb/sec (1X SDR)"`` → 2.5; None for anything else."""
    parts = text.split()
    if len(parts) < 2 or parts[1] != "Gb/sec":
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_counter(text: bytes) -> int | None:
    """A decimal counter; None for ``N/A (no PMA)`` or anything that is not a number."""
    text = text.strip()
    return int(text) if text.isdigit() else None


# ---------------------------------------------------------------- reading


def _read(path: str) -> bytes:
    """One read: a sysfs attribute is at most a page, and `show` fills it in one call."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _attr(path: str) -> str | None:
    try:
        return _read(path).decode("utf-8", "replace").strip()
    except OSError:
        return None


def class_dir(paths: HostPaths) -> str:
    return paths.sys("class", "infiniband")


def list_ports(paths: HostPaths) -> dict[str, list[int]]:
    """Devices and their port numbers, without reading anything else. Raises OSError
    when /sys/class/infiniband cannot be listed (FileNotFoundError: no RDMA driver)."""
    base = class_dir(paths)
    out: dict[str, list[int]] = {}
    for dev in sorted(os.listdir(base)):
        if dev.startswith("."):
            continue
        try:
            out[dev] = sorted(int(p) for p in os.listdir(os.path.join(base, dev, "ports")) if p.isdigit())
        except OSError:
            out[dev] = []
    return out


@dataclass
class CounterReader:
    """Reads the counters of a port, skipping files that failed with EINVAL before
    (`skipped`: relative paths, kept by the caller across runs of this boot)."""

    hw_counters: tuple[str, ...]
    skipped: set[str] = field(default_factory=set)
    newly_skipped: list[str] = field(default_factory=list)

    def read(self, base: str, device: str, number: int) -> dict[str, int]:
        out: dict[str, int] = {}
        rel = f"{device}/ports/{number}"
        self._read_dir(out, base, f"{rel}/counters", COUNTERS)
        if self.hw_counters:
            self._read_dir(out, base, f"{rel}/hw_counters", self.hw_counters)
        return out

    def _read_dir(self, out: dict[str, int], base: str, rel: str, names: Iterable[str]) -> None:
        for name in names:
            path = f"{rel}/{name}"
            if path in self.skipped:
                continue
            try:
                value = parse_counter(_read(os.path.join(base, path)))
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    self.skipped.add(path)
                    self.newly_skipped.append(path)
                continue  # ENOENT: this driver has no such counter; EACCES: the agent may not read it
            if value is not None:
                out[name] = value


def read_device(base: str, name: str, numbers: Iterable[int], counters_for: Callable[[int], bool], reader: CounterReader) -> Device:
    """One device and the given ports of it; `counters_for(port)` says whether to read its counters."""
    d = os.path.join(base, name)
    ports = tuple(_read_port(base, name, n, counters_for(n), reader) for n in numbers)
    return Device(
        name=name,
        board_id=_attr(os.path.join(d, "board_id")) or "",
        hca_type=_attr(os.path.join(d, "hca_type")) or "",
        fw_ver=_attr(os.path.join(d, "fw_ver")) or "",
        ports=ports,
    )


def _read_port(base: str, device: str, number: int, counters: bool, reader: CounterReader) -> Port:
    d = os.path.join(base, device, "ports", str(number))
    problems: list[str] = []

    def attr(name: str) -> str:
        text = _attr(os.path.join(d, name))
        if text is None:
            problems.append(f"cannot read {name}")
        return text or ""

    state_text, phys_text, rate_text = attr("state"), attr("phys_state"), attr("rate")
    state, phys, rate = parse_state(state_text), parse_state(phys_text), parse_rate(rate_text)
    for name, text, value in (("state", state_text, state), ("phys_state", phys_text, phys), ("rate", rate_text, rate)):
        if text and value is None:
            problems.append(f"cannot parse {name} {text[:40]!r}")
    return Port(
        device=device,
        number=number,
        state=state,
        phys=phys,
        rate_gbps=rate,
        link_layer=_attr(os.path.join(d, "link_layer")) or "Unknown",
        counters=reader.read(base, device, number) if counters else {},
        problems=tuple(problems),
    )
