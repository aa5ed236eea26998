"""PCI addresses of NVIDIA GPUs: normalising the spellings of the kernel log and
NVML, and listing the GPUs the PCI bus has (whether or not NVML sees them).

The driver prints ``domain:bus:device`` (``PCI:0000:3b:00``, four + two + two
lower-case hex digits, no function); NVML's ``busId`` is ``00000000:3B:00.0``
(eight-digit domain, upper case, with the function); ``busIdLegacy`` has a
four-digit domain. All of them normalise to ``0000:3b:00``.
"""

from __future__ import annotations

import os

from ..hostpaths import HostPaths, read_text

NVIDIA_VENDOR = "0x10de"
# PCI class codes (base class 0x03 display): 0x0300 VGA, 0x0302 3D controller
# (data-centre GPUs), 0x0380 other display. NVSwitches (0x0680) and the GPUs'
# HDMI audio functions (0x0403) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302", "0x0380")


def is_gpu(vendor: str, pci_class: str) -> bool:
    """What a GPU is, for every part of the agent that counts them (the GPU
    check, the Xid source, the burn): an NVIDIA function whose PCI class
    (sysfs ``class``, e.g. ``0x030200``: class, subclass, prog-if) is a display
    controller of `GPU_CLASSES`."""
    return vendor.strip().lower() == NVIDIA_VENDOR and pci_class.strip().lower()[:6] in GPU_CLASSES


def normalize(bus_id: str | bytes) -> str:
    """Any spelling of a GPU's PCI address → ``dddd:bb:dd`` (lower case); "" if not one."""
    s = (bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else bus_id).strip().lower().removeprefix("pci:")
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return ""
    domain, bus, dev = parts[0], parts[1], parts[2].split(".")[0]
    out = f"{domain[-4:].rjust(4, '0')}:{bus.rjust(2, '0')}:{dev.rjust(2, '0')}"
    if not all(c in "0123456789abcdef:" for c in out) or len(out) != 10:
        return ""
    return out


def bus_gpus(paths: HostPaths) -> dict[str, str]:
    """The NVIDIA display/3D devices on the PCI bus: normalised address → the
    driver bound to it ("" when none, e.g. after a failed probe), sorted by
    address (the order in which NVML numbers the GPUs it sees)."""
    base = paths.sys("bus/pci/devices")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    out = {}
    for name in names:
        dev = os.path.join(base, name)
        if not is_gpu(read_text(os.path.join(dev, "vendor"), "") or "", read_text(os.path.join(dev, "class"), "") or ""):
            continue
        addr = normalize(name)
        if addr:
            try:
                out[addr] = os.path.basename(os.readlink(os.path.join(dev, "driver")))
            except OSError:
                out[addr] = ""
    return dict(sorted(out.items()))


def nvml_candidates(bus: dict[str, str]) -> list[str]:
    """GPUs NVML should see: bound to nvidia, or to nothing (a GPU whose probe
    failed). Those given to vfio-pci (passed through to a VM) or another driver
    are not NVML's."""
    return [addr for addr, driver in bus.items() if driver in ("nvidia", "")]
