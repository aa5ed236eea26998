"""Fakes for the remediation ladder: a host whose commands are recorded, a
cluster that keeps to the contract (/work/coord/remediation-interface.md),
findings with an action, and a clock the test moves."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.catalog import Catalog
from agent.findings import Finding, Sample, Severity
from agent.hostpaths import HostPaths
from agent.remediation import catalog as rcat
from agent.remediation.faults import Fault, faults
from agent.remediation.host import Host, Result
from agent.remediation.ladder import Ladder
from agent.remediation.settings import RemediationSection
from agent.schema import build
from agent.statedir import StateDir

CATALOG = Catalog.declare(rcat.REASONS, rcat.METRICS)


def settings(**raw: Any) -> RemediationSection:
    """A [remediation] section from TOML-like values ("0s" durations and all)."""
    base: dict[str, Any] = {"reset_gpu_after": "0s", "reboot_after": "0s", "drain_after": "0s", "rma_after": "0s"}
    for k, v in raw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k].update(v)
        else:
            base[k] = v
    out: RemediationSection = build(RemediationSection, base, "remediation", "test.toml")
    return out


def enforce(*actions: str, **raw: Any) -> RemediationSection:
    raw.setdefault("reboot", {}).setdefault("min_uptime", "0s")
    return settings(mode="enforce", actions=list(actions or ("drain", "reset_gpu", "reboot", "retire")), **raw)


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeHost(Host):
    """Records every disruptive call; a reboot changes nothing until the test boots."""

    def __init__(self, cfg: RemediationSection) -> None:
        super().__init__(cfg, HostPaths())
        self.calls: list[tuple[str, ...]] = []
        self.boot = "boot-1"
        self.up: float | None = 99_999.0
        self.pids: dict[str, tuple[int, ...] | None] = {}
        self.mig: dict[str, bool] = {}
        self.reset_ok = True
        self.verify_ok = True
        self.reboot_ok = True
        self.clock: Clock | None = None  # the test's clock (make() sets it): the boot clock runs with it
        self.boot_t0: float | None = None  # the test clock's reading when this boot began

    def boot_clock(self) -> float:
        """CLOCK_BOOTTIME of this fake host: the test's clock since the boot (the first boot began 100,000 s before Clock's start)."""
        t = self.clock.t if self.clock is not None else 0.0
        return t - (self.boot_t0 if self.boot_t0 is not None else Clock().t - 100_000.0)

    def boot_id(self) -> str:
        return self.boot

    def uptime(self) -> float | None:
        return self.up

    def gpu_processes(self, uuid: str) -> tuple[int, ...] | None:
        return self.pids.get(uuid, ())

    def gpu_mig(self, uuid: str) -> bool | None:
        return self.mig.get(uuid, False)

    def reset_gpu(self, uuid: str) -> Result:
        self.calls.append(("reset_gpu", uuid))
        return Result(self.reset_ok, "fake reset")

    def verify_gpu(self, uuid: str, index: str) -> Result:
        self.calls.append(("verify", uuid))
        return Result(self.verify_ok, "fake verify")

    def reboot(self) -> Result:
        self.calls.append(("reboot",))
        return Result(self.reboot_ok, "fake reboot")

    def retire_command(self) -> Result:
        self.calls.append(("retire_command",))
        return Result(True, "fake retire command")

    def power_off(self) -> Result:
        self.calls.append(("power_off",))
        return Result(True, "fake power off")

    def booted(self, boot: str) -> None:
        self.boot, self.up = boot, 0.0
        self.boot_t0 = self.clock.t if self.clock is not None else None

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


@dataclass(frozen=True)
class Progress:
    done: bool
    timed_out: bool = False
    evicted: int = 0
    blocked: tuple[str, ...] = ()
    remaining: tuple[str, ...] = ()


@dataclass
class FakeCluster:
    """The contract's KubeRemediation: drains take `drain_steps` calls; `slots` free slots."""

    pods: dict[str, str] = field(default_factory=lambda: {"uid-a": "ml/a", "uid-b": "ml/b", "uid-c": "ml/c"})
    drain_steps: int = 1
    slots: int = 1
    present: bool = True
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    held: bool = False
    retired: bool = False
    fail: Exception | None = None
    renewals: int = 0
    tripped: str = ""  # the fleet breaker's answer ("": closed)
    untainted: str = ""  # why the node lacks its taint ("": it carries it)
    breaker_steps: list[str] = field(default_factory=list)

    def plan_drain(self, only_pod_uids: frozenset[str] | None = None) -> list[str]:
        return sorted(p for u, p in self.pods.items() if only_pod_uids is None or u in only_pod_uids)

    def drain(self, now: float, only_pod_uids: frozenset[str] | None = None) -> Progress:
        self.calls.append(("drain", None if only_pod_uids is None else tuple(sorted(only_pod_uids))))
        if self.fail:
            raise self.fail
        done = sum(1 for c in self.calls if c[0] == "drain") >= self.drain_steps
        return Progress(done=done, evicted=1, remaining=() if done else ("ml/a",))

    def claim_slot(self, now: float) -> bool:
        self.calls.append(("claim",))
        if self.held:
            return True
        if self.slots > 0:
            self.slots -= 1
            self.held = True
            return True
        return False

    def renew_slot(self, now: float) -> bool:
        self.renewals += 1
        return self.held

    def slot_wait(self) -> str:
        return "" if self.held else "every slot is held by other nodes (fake)"

    def release_slot(self, now: float) -> None:
        self.calls.append(("release",))
        if self.held:
            self.held = False
            self.slots += 1

    def breaker_check(self, now: float, step: str) -> str:
        self.breaker_steps.append(step)
        return self.tripped

    def taint_withheld(self) -> str:
        return self.untainted

    def set_retired(self, retired: bool, message: str) -> None:
        self.calls.append(("set_retired", retired))
        self.retired = retired

    def node_retired(self) -> bool:
        return self.retired

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


class Users:
    """The attribution seam; processes come from the host's fake (as nvidia-smi would list them)."""

    def __init__(self, pods: dict[str, frozenset[str]] | None = None, host: Host | None = None) -> None:
        self.pods = pods or {}
        self.host = host

    def pods_on_gpu(self, uuid: str) -> frozenset[str] | None:
        return self.pods.get(uuid)

    def processes_on_gpu(self, uuid: str) -> tuple[int, ...] | None:
        return self.host.gpu_processes(uuid) if self.host else ()


def finding(reason: str, action: str, subject: str = "gpu0", check: str = "gpu", unknown: bool = False) -> Finding:
    return Finding(check, subject, reason, Severity.CRITICAL, f"{reason} on {subject}", unknown=unknown, action=action)


GPU_INFO = (Sample("node_health_gpu_info", 1, (("gpu", "0"), ("pci_bus_id", "00000000:18:00.0"), ("uuid", "GPU-aaaa")),),
            Sample("node_health_gpu_info", 1, (("gpu", "1"), ("pci_bus_id", "00000000:28:00.0"), ("uuid", "GPU-bbbb")),))


def fault_list(*fs: Finding, samples: Iterable[Sample] = GPU_INFO) -> list[Fault]:
    return faults(list(fs), samples)


def make(tmp: Any, cfg: RemediationSection, *, cluster: FakeCluster | None = None, host: FakeHost | None = None,
         users: Users | None = None, clock: Clock | None = None, dry_run: bool = False,
         go_ahead: Callable[[], str | None] | None = None, wall: Clock | None = None) -> Ladder:
    """A ladder on the state dir `tmp`; its monotonic clock is `clock` too (one clock the test moves), and so
    is its wall clock unless `wall` (a clock the test steps apart) is given; the boot clock is the host's."""
    state = StateDir(str(tmp))
    state.ensure()
    host = host or FakeHost(cfg)
    if users is not None and users.host is None:
        users.host = host
    clock = clock or Clock()
    host.clock = clock
    return Ladder(cfg, state, host, cluster if cluster is not None else FakeCluster(),
                  catalog=CATALOG, users=users, dry_run=dry_run, clock=wall or clock, mono=clock, uptime=host.boot_clock,
                  go_ahead=go_ahead or (lambda: None))


def value(ladder: Ladder, name: str, **labels: str) -> float | None:
    for s in ladder.samples():
        if s.name == name and dict(s.labels) == labels:
            return s.value
    return None
