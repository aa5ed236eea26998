"""Event sources under test: a collector of what a source emits, and a file of
/dev/kmsg records appended as the kernel would (the follower reads a regular
file as it reads /dev/kmsg)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.findings import Finding, Sample, Severity


class Collector:
    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.findings: list[Finding] = []
        self.samples: list[Sample] = []
        self.emits = 0

    def __call__(self, findings, samples) -> None:  # type: ignore[no-untyped-def]
        with self.cv:
            self.findings, self.samples = list(findings), list(samples)
            self.emits += 1
            self.cv.notify_all()

    def wait(self, pred: Callable[[Collector], bool], timeout: float = 15.0) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: pred(self), timeout), (self.findings, self.samples)

    def active(self) -> dict[tuple[str, str], Severity]:
        return {(f.subject, f.reason): f.severity for f in self.findings}

    def value(self, name: str, **labels: str) -> float | None:
        for s in self.samples:
            if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
                return s.value
        return None


class Log:
    """A file of /dev/kmsg records, appended as the kernel would."""

    def __init__(self, path: str) -> None:
        self.path, self.seq = path, 0
        open(path, "w").close()

    def add(self, message: str, seq: int | None = None, prio: int = 4) -> None:
        self.seq = self.seq if seq is None else seq
        with open(self.path, "a") as fh:
            fh.write(f"{prio},{self.seq},{int(time.monotonic() * 1e6)},-;{message}\n SUBSYSTEM=pci\n")
        self.seq += 1
