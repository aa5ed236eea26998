"""The disruptive steps on this host, each behind a seam tests replace.

Every step runs a real program (nvidia-smi, systemctl, busctl, nsenter, the
operator's command) with a time limit and a bounded capture of its output,
so tests put fake ones first on PATH that record their arguments and can
fail; the boot ID and the uptime are read under the configurable procfs.
Nothing here decides anything: `agent.remediation.ladder` does.

GPU reset (docs/remediation.md): NVML has no public reset call, so it is
``nvidia-smi --gpu-reset -i <UUID>``. It fails with "In use by another
client" (exit 255) while anything holds the device, persistence mode
included (NVIDIA/NVSentinel#1690), so persistence is turned off first and
restored after when it was on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..hostpaths import HostPaths, read_text
from ..statedir import boot_id
from .settings import RemediationSection

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 4096  # bytes of a command's output kept for the log and the finding
NSENTER = ("nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--")
LOGIND = ("busctl", "call", "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager")


@dataclass(frozen=True, slots=True)
class Result:
    ok: bool
    detail: str  # one line: what ran and how it ended


def run(argv: Sequence[str], timeout: float) -> Result:
    """Run `argv`; ok when it exits 0 within `timeout`."""
    shown = " ".join(argv)
    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Result(False, f"{shown}: no answer in {timeout:g}s (killed)")
    except OSError as exc:
        return Result(False, f"{shown}: cannot run it: {exc.strerror or exc}")
    out = p.stdout[:OUTPUT_LIMIT].decode("utf-8", "replace").strip().replace("\n", " | ")
    if p.returncode != 0:
        return Result(False, f"{shown}: exit {p.returncode}" + (f": {out[:400]}" if out else ""))
    return Result(True, f"{shown}: ok" + (f": {out[:200]}" if out else ""))


def output(argv: Sequence[str], timeout: float) -> str | None:
    """stdout of a query, or None when it failed."""
    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           timeout=timeout, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return p.stdout[:OUTPUT_LIMIT].decode("utf-8", "replace") if p.returncode == 0 else None


class Host:
    """This host's boot ID and uptime, and the reset, reboot, retire and power-off commands."""

    def __init__(self, cfg: RemediationSection, paths: HostPaths, *, burn_argv: Sequence[str] = ()) -> None:
        self.cfg, self.paths = cfg, paths
        self.smi = cfg.gpu_reset.nvidia_smi
        self.burn_argv = tuple(burn_argv)  # `agent burn` with the agent's config: how a reset GPU is burned

    # ------------------------------------------------------------ facts

    def boot_id(self) -> str:
        return boot_id(self.paths)

    def uptime(self) -> float | None:
        raw = read_text(self.paths.proc("uptime"))
        try:
            return float(raw.split()[0]) if raw else None
        except (ValueError, IndexError):
            return None

    def gpu_processes(self, uuid: str) -> tuple[int, ...] | None:
        """PIDs of the compute processes on the GPU (NVML's list, through nvidia-smi); None: cannot tell."""
        out = output([self.smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits", "-i", uuid],
                     self.cfg.gpu_reset.timeout)
        if out is None:
            return None
        return tuple(int(w) for w in out.split() if w.isdigit())

    def gpu_mig(self, uuid: str) -> bool | None:
        out = output([self.smi, "--query-gpu=mig.mode.current", "--format=csv,noheader", "-i", uuid],
                     self.cfg.gpu_reset.timeout)
        if out is None:
            return None
        return out.strip().lower() == "enabled"

    def _persistence(self, uuid: str) -> bool | None:
        out = output([self.smi, "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", uuid],
                     self.cfg.gpu_reset.timeout)
        return None if out is None else out.strip().lower() == "enabled"

    # ------------------------------------------------------------ GPU reset

    def reset_unavailable(self) -> str | None:
        """Why no GPU reset can run here (nvidia-smi is not there to run), or None."""
        if shutil.which(self.smi) is not None:
            return None
        return (f'nvidia-smi ("{self.smi}", remediation.gpu_reset.nvidia_smi) is not found here, so no GPU can be '
                "reset; in a pod it comes with the NVIDIA container runtime (the chart's nvidiaRuntime.enabled, "
                "the nvidia-runtime kustomize component)")

    def reset_gpu(self, uuid: str) -> Result:
        """Persistence off (when on), reset, persistence restored; refused before anything runs
        when nvidia-smi is not there."""
        missing = self.reset_unavailable()
        if missing is not None:
            return Result(False, f"GPU reset refused: {missing}")
        t = self.cfg.gpu_reset.timeout
        toggle = self.cfg.gpu_reset.toggle_persistence and self._persistence(uuid) is not False
        steps = []
        if toggle:
            off = run([self.smi, "-i", uuid, "-pm", "0"], t)
            steps.append(off.detail)
            if not off.ok:
                return Result(False, "; ".join(steps))
        reset = run([self.smi, "--gpu-reset", "-i", uuid], t)
        steps.append(reset.detail)
        if toggle:
            on = run([self.smi, "-i", uuid, "-pm", "1"], t)
            steps.append(on.detail)
            if not on.ok:
                log.error("GPU %s: persistence mode not restored: %s", uuid, on.detail)
        return Result(reset.ok, "; ".join(steps))

    def verify_gpu(self, uuid: str, index: str) -> Result:
        """NVML sees the GPU again (nvidia-smi -q), and a short burn passes where a backend is present."""
        q = run([self.smi, "-q", "-i", uuid], self.cfg.gpu_reset.timeout)
        if not q.ok or not self.burn_argv or self.cfg.gpu_reset.verify_burn <= 0 or not index:
            return q
        seconds = self.cfg.gpu_reset.verify_burn
        argv = [*self.burn_argv, "--json", "--gpus", index, "--seconds", f"{seconds:g}"]
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               timeout=seconds * 4 + 120, check=False)
            status = json.loads(p.stdout or b"{}").get("status", "unknown")
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            return Result(False, f"burn of GPU {index}: {exc}")
        if status == "fail":
            return Result(False, f"burn of GPU {index} after the reset failed")
        note = "passed" if status == "pass" else "not run (no burn backend here)"
        return Result(True, f"{q.detail}; burn of GPU {index} {note}")

    # ------------------------------------------------------------ reboot, retire, power off

    def _systemd(self, verb: str, logind_method: str) -> list[str]:
        rs = self.cfg.reboot
        argv = [*LOGIND, logind_method, "b", "false"] if rs.systemd_via == "logind" else ["systemctl", verb]
        return [*NSENTER, *argv] if rs.host_namespaces else argv

    def describe_reboot(self) -> str:
        rs = self.cfg.reboot
        if rs.method == "kured":
            return f"kured: write {self._kured_path()}"
        argv = list(rs.command) if rs.method == "command" else self._systemd("reboot", "Reboot")
        return f"{rs.method}: {' '.join(argv)}"

    def reboot(self) -> Result:
        rs = self.cfg.reboot
        if rs.method == "kured":
            return self._sentinel(self._kured_path())
        argv = list(rs.command) if rs.method == "command" else self._systemd("reboot", "Reboot")
        return run(argv, self.cfg.command_timeout)

    def _kured_path(self) -> str:
        """The sentinel where the host has it: its symbolic links (/var/run → /run) resolved
        within the host's root, never into this container's own /run."""
        return under_root(self.paths.rootfs, self.cfg.reboot.kured_sentinel)

    def _sentinel(self, path: str) -> Result:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            return Result(False, f"cannot write the kured sentinel {path}: {exc.strerror or exc}")
        return Result(True, f"wrote the kured sentinel {path}")

    def retire_command(self) -> Result:
        return run(self.cfg.retire.command, self.cfg.command_timeout)

    def power_off(self) -> Result:
        return run(self._systemd("poweroff", "PowerOff"), self.cfg.command_timeout)


MAX_LINKS = 40  # as the kernel's path walk (ELOOP)


def under_root(rootfs: str, host_path: str) -> str:
    """`host_path` as the host resolves it, as a path under `rootfs` here: each symbolic link
    met on the way is followed within `rootfs` (an absolute target starts again at `rootfs`,
    ".." stops there), as chroot(rootfs) would. Components that do not exist are kept as
    they are (the file to create, its missing directories)."""
    root = os.path.abspath(rootfs or "/")
    todo = [c for c in host_path.split("/") if c not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        try:
            target = os.readlink(here)
        except OSError:  # not a link, or not there: taken as it is
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            done.append(part)  # a loop: writing there fails with ELOOP, and says so
            todo = []
            break
        if target.startswith("/"):
            done = []
        todo = [c for c in target.split("/") if c not in ("", ".")] + todo
    return os.path.join(root, *done)


def burn_argv(config_path: str | None) -> tuple[str, ...]:
    """`agent burn` with the running agent's config."""
    argv: tuple[str, ...] = (sys.executable, "-m", "agent", "burn")
    return argv + (("--config", config_path) if config_path else ())
