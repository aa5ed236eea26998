"""Who owns a process, from its ``/proc/<pid>/cgroup``: a Kubernetes pod (and
container), a batch job (Slurm), a systemd unit, or nothing we can name.

The kubelet puts every pod in a cgroup whose path carries the pod UID, in two
spellings (kubelet ``pkg/kubelet/cm/cgroup_manager_linux.go``):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``
  with the UID's dashes turned into underscores (systemd escapes ``-`` as the
  slice hierarchy separator); Guaranteed pods skip the QoS level
  (``kubepods-pod<uid>.slice``), kind nodes nest it under ``kubelet.slice``;
- cgroupfs driver: ``/kubepods/burstable/pod<uid>`` (``/kubepods/pod<uid>``).

Static (mirror) pods have a 32-hex config hash for a UID, no dashes. Below the
pod sits the container: ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
``docker-<id>.scope`` (systemd) or the bare 64-hex ``<id>`` (cgroupfs; cri-o
writes ``crio-<id>``). ``crio-conmon-<id>.scope`` is cri-o's monitor, not the
container. A reader in a cgroup namespace of its own (a pod without the host's
cgroup namespace) sees other processes' paths relative to its own root
(``/../../kubepods.slice/...``): the parser looks at components, never at a
fixed prefix, so both read the same.

cgroup v2 has one line ``0::<path>``; v1 has one per hierarchy
(``4:memory:<path>``); every line is looked at and the most specific owner
wins (pod over job over unit). Slurm puts job steps in ``.../job_<id>/step_<s>/``
(v1 ``/slurm/uid_<u>/job_<id>/...``; v2 ``/system.slice/slurmstepd.scope/job_<id>/...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..hostpaths import HostPaths, read_bounded

POD = "pod"
JOB = "job"
CONTAINER = "container"
UNIT = "unit"
OTHER = "other"

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[-/])pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|cri-dockerd|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "cri-dockerd": "docker", "libpod": "podman"}
_JOB = re.compile(r"^job_(\d+)$")
_UNIT = re.compile(r"^[^/]+\.(?:service|scope)$")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a process belongs to. `kind` is pod, job, container (one outside
    Kubernetes), unit or other; `name` is the pod UID, the job id, the container
    id, the unit name, or "" for other."""

    kind: str
    name: str = ""
    container: str = ""  # container id (pods and plain containers)
    runtime: str = ""  # containerd, cri-o, docker, podman; "" when the path does not say

    @property
    def pod_uid(self) -> str:
        return self.name if self.kind == POD else ""


NOBODY = Owner(OTHER)


def parse(text: str) -> Owner:
    """The owner named by the text of a ``/proc/<pid>/cgroup`` file (v1 or v2)."""
    best = NOBODY
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        owner = parse_path(parts[2])
        if _RANK[owner.kind] > _RANK[best.kind]:
            best = owner
    return best


_RANK = {OTHER: 0, UNIT: 1, CONTAINER: 2, JOB: 3, POD: 4}


def parse_path(path: str) -> Owner:
    """The owner named by one cgroup path."""
    parts = [p for p in path.split("/") if p and p != ".."]
    for i, part in enumerate(parts):
        m = _POD.search(part)
        if m:
            uid = m.group(1).replace("_", "-")
            container, runtime = _container(parts[i + 1 :])
            return Owner(POD, uid, container, runtime)
    for part in parts:
        m = _JOB.match(part)
        if m:
            return Owner(JOB, m.group(1))
    container, runtime = _container(parts[-1:])
    if container:
        return Owner(CONTAINER, container, container, runtime)
    for part in reversed(parts):
        if _UNIT.match(part) and not part.startswith("crio-conmon-"):
            return Owner(UNIT, part)
    return NOBODY


def _container(parts: list[str]) -> tuple[str, str]:
    for part in parts:
        m = _CONTAINER.match(part)
        if m:
            return m.group(2), _RUNTIMES.get(m.group(1) or "", "")
    return "", ""


def owner_of(paths: HostPaths, pid: int) -> Owner | None:
    """The owner of host process `pid`, None if it is gone (or not visible from here)."""
    try:
        data = read_bounded(paths.proc(str(pid), "cgroup"), 1 << 16)
    except (OSError, ValueError):
        return None
    return parse(data.decode("utf-8", "replace"))
