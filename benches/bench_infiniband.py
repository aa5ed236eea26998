#!/usr/bin/env python3
"""CPU cost of one InfiniBand check run on a node with 8 HCAs and 16 ports, and where it goes.

A fixture /sys/class/infiniband (tests/support/ibtree.py: 8 dual-port ConnectX-7 HCAs, every
port ACTIVE at 400 Gb/s, the 16 IBTA/data counters and 7 hw_counters per port) on this
machine's temporary directory, and a throwaway state dir. Timed (CPU time of the calling
thread, median and minimum of `--repeat` batches, `benches/_timing.py`):

- `run`: the whole `InfinibandCheck.run()` as the scheduler calls it: read, export, judge,
  save the state file (JSON, write, fsync, rename, fsync of the directory);
- `read`: only reading the tree (listing, attributes, counters) into `Device`/`Port` records;
- `syscalls`: open/read/close of the same files and nothing else (the floor of any reader,
  native included, that reads one sysfs file per value as the kernel requires);
- `parse`: parsing the same bytes (state, rate, decimal counters) without any I/O;
- `save`: writing the state file alone.

On real hardware a read of a `counters/` file is a management datagram to the HCA's firmware
(microseconds to milliseconds in the kernel, not in this process's user time), so the kernel
side there is larger than on these tmpfs files; the user-space share is what these figures show.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # conftest
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from _timing import measure  # noqa: E402
from ibtree import CX7, Clock, IbTree, make_check  # noqa: E402

from agent.infiniband import sysfs  # noqa: E402
from agent.infiniband.memory import STATE_FILE  # noqa: E402
from agent.infiniband.settings import DEFAULT_HW_COUNTERS  # noqa: E402
from agent.statedir import StateDir  # noqa: E402


def build(base: Path) -> IbTree:
    tree = IbTree(base / "host")
    for i in range(8):
        tree.device(f"mlx5_{i}", CX7, ports=2)
    return tree


def files(tree: IbTree) -> list[str]:
    out = []
    for dev in sorted(os.listdir(tree.cls)):
        d = tree.cls / dev
        out += [str(d / a) for a in ("board_id", "hca_type", "fw_ver")]
        for port in sorted(os.listdir(d / "ports")):
            p = d / "ports" / port
            out += [str(p / a) for a in ("state", "phys_state", "rate", "link_layer")]
            out += [str(p / "counters" / c) for c in sysfs.COUNTERS]
            out += [str(p / "hw_counters" / c) for c in DEFAULT_HW_COUNTERS]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--timer", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ib-") as tmp:
        tree = build(Path(tmp))
        clock = Clock()
        check = make_check(tree, Path(tmp) / "state", clock)
        obs = check.run()
        assert not obs.findings, obs.findings
        paths = files(tree)
        blobs = [sysfs._read(p) for p in paths]
        listing = sysfs.list_ports(tree.paths)
        base = sysfs.class_dir(tree.paths)
        state = StateDir(str(Path(tmp) / "state"))
        memory = json.loads((Path(tmp) / "state" / STATE_FILE).read_text())

        def run() -> None:
            clock.advance(30)
            check.run()

        def read() -> None:
            reader = sysfs.CounterReader(DEFAULT_HW_COUNTERS)
            for name, ports in sysfs.list_ports(tree.paths).items():
                sysfs.read_device(base, name, ports, lambda _: True, reader)

        def syscalls() -> None:
            for p in paths:
                sysfs._read(p)

        def parse() -> None:
            for b in blobs:
                text = b.decode()
                sysfs.parse_state(text) or sysfs.parse_rate(text) or sysfs.parse_counter(b)

        figures = measure(
            {"run": run, "read": read, "syscalls": syscalls, "parse": parse,
             "save": lambda: state.write_json(STATE_FILE, memory)},
            args.repeat, args.timer,
        )
    ports = sum(len(p) for p in listing.values())
    result = {
        "devices": len(listing), "ports": ports, "files": len(paths),
        "samples": len(obs.samples), "state_file_bytes": len(json.dumps(memory)),
        "ms": {k: {"median": f.median * 1e3, "min": f.minimum * 1e3} for k, f in figures.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['devices']} HCAs, {ports} ports, {len(paths)} files per run, {result['samples']} samples, "
          f"state file {result['state_file_bytes']} bytes; {args.timer} time per call, ms (median, min):")
    for name, f in figures.items():
        print(f"  {name:9} {f.ms()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
