"""Processes stuck in the NVIDIA driver: in uninterruptible sleep (state ``D``)
with a ``/dev/nvidia*`` file open, and how many polls in a row each stayed so.

A thread waiting in a wedged driver sleeps uninterruptibly and no signal ends
it; ``nvidia-smi`` stuck for minutes and a container runtime unable to kill a
GPU job are how a hung GPU usually shows up on a node (GPUd
``components/os/blocked_processes.go`` turns 5 consecutive sightings into a
reboot suggestion). A process is in ``D`` for milliseconds during ordinary I/O,
so one sighting means nothing; the same process (pid and start time, so a
reused pid is a new process) seen in ``D`` on every one of N polls does.

Only ``/proc/<pid>/stat`` (the main thread's state) and, for the processes in
``D``, the ``/proc/<pid>/fd`` links are read: never ``cmdline`` or ``maps``,
which take the process's mmap lock and can block behind the stuck thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..hostpaths import HostPaths

DEVICE_PREFIX = "/dev/nvidia"  # nvidia0…N, nvidiactl, nvidia-uvm, nvidia-caps/…, nvidia-nvswitchN


@dataclass(frozen=True, slots=True)
class Stuck:
    pid: int
    start: int  # starttime (clock ticks since boot): with pid, one process
    comm: str
    devices: tuple[str, ...]


def parse_stat(raw: bytes) -> tuple[str, str, int] | None:
    """(comm, state, starttime) from a /proc/<pid>/stat line; comm may hold spaces and ')'."""
    text = raw.decode("utf-8", "replace")
    left, sep, rest = text.rpartition(")")
    if not sep or "(" not in left:
        return None
    fields = rest.split()
    if len(fields) < 20:  # state is field 3, starttime field 22 (proc(5))
        return None
    try:
        return left.partition("(")[2], fields[0], int(fields[19])
    except ValueError:
        return None


def nvidia_files(fd_dir: str) -> tuple[str, ...]:
    """The /dev/nvidia* files among a process's open files (sorted, each once)."""
    try:
        names = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return ()
    found = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith(DEVICE_PREFIX):
            found.add(target)
    return tuple(sorted(found))


def scan(paths: HostPaths) -> list[Stuck]:
    """Processes whose main thread is in D with a /dev/nvidia* file open, now."""
    out = []
    try:
        pids = [p for p in os.listdir(paths.procfs) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(paths.proc(pid, "stat"), "rb") as fh:
                parsed = parse_stat(fh.read(4096))
        except OSError:
            continue  # exited meanwhile
        if parsed is None or parsed[1] != "D":
            continue
        devices = nvidia_files(paths.proc(pid, "fd"))
        if devices:
            out.append(Stuck(int(pid), parsed[2], parsed[0], devices))
    return out


class StuckTracker:
    """How many polls in a row each stuck process has been seen; forgets one the
    moment it is not in D (or gone)."""

    def __init__(self) -> None:
        self.polls: dict[tuple[int, int], int] = {}

    def update(self, now: list[Stuck]) -> list[tuple[Stuck, int]]:
        """Each process stuck now, with the polls in a row it has been stuck (this one included)."""
        polls = {(s.pid, s.start): self.polls.get((s.pid, s.start), 0) + 1 for s in now}
        self.polls = polls
        return [(s, polls[(s.pid, s.start)]) for s in now]


def describe(stuck: list[tuple[Stuck, int]], limit: int = 4) -> str:
    parts = [f"{s.comm} (pid {s.pid}, {n} polls, {', '.join(s.devices[:3])})" for s, n in stuck[:limit]]
    more = f" and {len(stuck) - limit} more" if len(stuck) > limit else ""
    return "; ".join(parts) + more
