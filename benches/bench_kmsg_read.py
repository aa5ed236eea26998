"""What reading the real ``/dev/kmsg`` costs per record, user and kernel CPU apart.

The kernel-log benches (`bench_kernel_scan.py`, `bench_kmsg_storm.py`) read
records from a file; on a node the follower reads ``/dev/kmsg``, one record
per ``read()``, and the kernel formats each record inside that call. This
reads the whole ring of this machine's ``/dev/kmsg`` from the start, again
and again until 100,000 records per sample (CPU time is accounted in ticks),
`--repeat` samples, in two ways: bare ``os.read`` calls (what any reader pays:
the syscall and the kernel's formatting, plus Python's call) and the agent's
reader (`agent.kmsg.Kmsg.read_batch` with the fault table's screen: the one
native pass per batch). Thread CPU from ``getrusage(RUSAGE_THREAD)``, user and
system time apart, per record and as a share of one core at 100,000 lines a
second. Needs read access to ``/dev/kmsg`` (root or CAP_SYSLOG).

    python benches/bench_kmsg_read.py            # --repeat 9; --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PATH = "/dev/kmsg"
MIN_RECORDS = 100_000  # per sample


def bare() -> int:
    fd = os.open(PATH, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    n = 0
    try:
        while True:
            try:
                os.read(fd, 8192)
            except BlockingIOError:
                return n
            except BrokenPipeError:  # overwritten while we read: the next read resumes
                continue
            n += 1
    finally:
        os.close(fd)


def agent_reader() -> int:
    from agent.kernel.patterns import DEFAULT
    from agent.kmsg import Kmsg

    screen = DEFAULT.screen
    reader = Kmsg(PATH)
    n = 0
    try:
        while True:
            batch = reader.read_batch(screen=screen)
            n += len(batch)
            if not batch:
                return n
    finally:
        reader.close()


def measure(fn: Callable[[], int], repeat: int) -> dict[str, float]:
    users, systems, counts = [], [], []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        n = 0
        while n < MIN_RECORDS:  # the whole ring again and again: CPU time is accounted in ticks
            got = fn()
            if not got:
                break
            n += got
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        if n:
            users.append((r1.ru_utime - r0.ru_utime) / n)
            systems.append((r1.ru_stime - r0.ru_stime) / n)
            counts.append(n)
    user, system = statistics.median(users), statistics.median(systems)
    return {
        "records": statistics.median(counts), "user_us": round(user * 1e6, 3), "system_us": round(system * 1e6, 3),
        "core_share_at_100k_per_s_user": round(user * 1e5, 4), "core_share_at_100k_per_s_total": round((user + system) * 1e5, 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = {"bare os.read": measure(bare, a.repeat), "agent reader (read_batch + screen)": measure(agent_reader, a.repeat)}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'reader':36} {'records':>8} {'user us':>8} {'sys us':>8} {'user %':>7} {'total %':>8}  (of one core at 100,000 lines/s)")
    for name, f in out.items():
        print(f"{name:36} {f['records']:8.0f} {f['user_us']:8.2f} {f['system_us']:8.2f} "
              f"{f['core_share_at_100k_per_s_user'] * 100:6.1f}% {f['core_share_at_100k_per_s_total'] * 100:7.1f}%")


if __name__ == "__main__":
    main()
