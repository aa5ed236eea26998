"""The shipped systemd unit: it parses, and it allows what the agent needs."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

from conftest import require_tool

UNIT = Path(__file__).parent.parent.parent / "systemd" / "node-health-agent.service"


def _service() -> dict[str, str]:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return dict(parser["Service"])


def test_unit_has_the_contract_the_daemon_implements() -> None:
    svc = _service()
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert svc["WatchdogSec"] and svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"] == "2", "a bad config (exit 2) is not restarted in a loop"
    assert "--config /etc/node-health-agent/agent.toml" in svc["ExecStart"]
    assert "kill -HUP" in svc["ExecReload"]
    caps = svc["CapabilityBoundingSet"].split()
    assert {"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYSLOG"} <= set(caps)
    assert svc["StateDirectory"] == "node-health-agent"  # /var/lib/node-health-agent, the default state dir
    assert "ProtectKernelLogs" not in svc, "it would hide /dev/kmsg"
    assert svc.get("ProtectSystem") != "strict", "it would make / read-only for the disk check's write probe"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    require_tool("systemd-analyze")
    agent = shutil.which("agent")
    assert agent, "the agent console script is installed"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/node-health-agent/bin/agent", agent))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in res.stderr.splitlines() if UNIT.name in line]
    assert res.returncode == 0 and not problems, res.stderr


# What the agent and the libraries it loads do, and what it never does. NVML and
# the CUDA driver talk to /dev/nvidia* by ioctl and map GPU memory into the
# process (mmap, mremap, munmap, mprotect, madvise); the CUDA driver binds memory
# and threads to the GPU's NUMA node (mbind, set_mempolicy, sched_setaffinity);
# iptables-legacy replaces tables by setsockopt on a raw socket, iptables-nft and
# pyroute2 use netlink; the burn forks workers that set PR_SET_PDEATHSIG.
NEEDED_SYSCALLS = (
    "ioctl", "mmap", "mremap", "mlock", "munmap", "mprotect", "madvise", "mbind", "set_mempolicy", "get_mempolicy",
    "sched_setaffinity", "socket", "setsockopt", "getsockopt", "sendmsg", "recvmsg", "bind", "connect", "prctl",
    "clone", "clone3", "execve", "wait4", "memfd_create", "eventfd2", "epoll_wait", "poll", "futex", "statfs",
    "fsync", "rename", "renameat2", "unlink", "inotify_add_watch", "setrlimit", "setpriority",
)
DENIED_SYSCALLS = (
    "reboot", "kexec_load", "mount", "umount2", "pivot_root", "init_module", "finit_module", "delete_module",
    "settimeofday", "clock_settime", "adjtimex", "ptrace", "perf_event_open", "swapon", "iopl", "ioperm",
    "setuid", "setgroups", "chroot", "sethostname", "bpf",
)


def _syscalls(group: str) -> set[str]:
    """The system calls in a systemd group, nested groups expanded."""
    res = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, timeout=60, check=True)
    out: set[str] = set()
    for line in res.stdout.splitlines()[1:]:
        word = line.split("#", 1)[0].strip()
        if word.startswith("@"):
            out |= _syscalls(word)
        elif word:
            out.add(word)
    return out


def allowed_syscalls() -> set[str]:
    """The unit's SystemCallFilter= lines applied as systemd applies them: the
    first line without ~ is an allow list, each ~ line removes from it."""
    require_tool("systemd-analyze")
    lines = [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith("SystemCallFilter=")]
    assert lines and not lines[0].startswith("~"), "an allow list first"
    allowed: set[str] = set()
    for line in lines:
        deny = line.startswith("~")
        names: set[str] = set()
        for item in line.removeprefix("~").split():
            names |= _syscalls(item) if item.startswith("@") else {item}
        allowed = allowed - names if deny else allowed | names
    return allowed


def test_the_system_call_filter_allows_what_the_agent_does_and_nothing_it_never_does() -> None:
    allowed = allowed_syscalls()
    assert [s for s in NEEDED_SYSCALLS if s not in allowed] == []
    assert [s for s in DENIED_SYSCALLS if s in allowed] == []
    assert _service()["SystemCallErrorNumber"] == "EPERM", "a refused call fails the check, it does not kill the agent"


def test_hardening_keeps_what_the_checks_need() -> None:
    svc = _service()
    for key in ("RestrictSUIDSGID", "ProtectKernelTunables", "ProtectHostname", "PrivateMounts", "NoNewPrivileges"):
        assert svc.get(key) == "yes", key
    assert svc["UMask"] == "0077"
    # The GPU, the kernel log, other processes' /proc (pid 1's mountinfo, GPU holders' cgroups), the
    # host's network and /proc/diskstats: the agent's inputs, so these stay off.
    for key in ("PrivateDevices", "ProtectKernelLogs", "ProtectProc", "ProcSubset", "PrivateNetwork", "DeviceAllow"):
        assert key not in svc, f"{key} would hide one of the agent's inputs"


def exposure(unit: Path) -> float:
    """`systemd-analyze security`'s overall exposure of a unit file, scored offline."""
    require_tool("systemd-analyze")
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=60
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", res.stdout + res.stderr)
    assert m, res.stdout + res.stderr
    return float(m.group(1))


def test_systemd_analyze_security_scores_the_unit_at_most_3_5(tmp_path: Path) -> None:
    assert exposure(UNIT) <= 3.5
    # The measure can tell: without the hardening added for it, the unit scored 5.4.
    bare = tmp_path / UNIT.name
    bare.write_text("".join(line for line in UNIT.read_text().splitlines(keepends=True)
                            if not line.startswith(("SystemCallFilter=", "ProtectKernelTunables=", "PrivateMounts="))))
    assert exposure(bare) > 3.5
