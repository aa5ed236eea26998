"""Who owns a process, from /proc/<pid>/cgroup: every runtime and cgroup driver
as real nodes write it, near misses included, and real processes in real cgroups."""

from __future__ import annotations

import pytest
from cgroup_lab import process_in_cgroup

from agent.gpu import cgroups
from agent.gpu.cgroups import Owner
from agent.hostpaths import HostPaths

UID = "3f7c2a1e-9b4d-4c2e-8f6a-1d2e3f4a5b6c"
UND = UID.replace("-", "_")
CID = "4b825dc642cb6eb9a060e54bf8d69288fbee4904a1b2c3d4e5f60718293a4b5c"[:64]
STATIC = "6f2b5e6b9c5a4e2b8d1c0a9f8e7d6c5b"  # a static (mirror) pod's UID: its config hash


@pytest.mark.parametrize(
    ("text", "owner"),
    [
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UND}.slice/cri-containerd-{CID}.scope\n",
                     Owner("pod", UID, CID, "containerd"), id="v2 systemd containerd burstable"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{UND}.slice/cri-containerd-{CID}.scope\n",
                     Owner("pod", UID, CID, "containerd"), id="v2 systemd guaranteed (no QoS slice)"),
        pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UND}.slice/crio-{CID}.scope\n",
                     Owner("pod", UID, CID, "cri-o"), id="v2 systemd cri-o"),
        pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UND}.slice/crio-conmon-{CID}.scope\n",
                     Owner("pod", UID, "", ""), id="cri-o conmon: the pod, no container"),
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UND}.slice/docker-{CID}.scope\n",
                     Owner("pod", UID, CID, "docker"), id="v2 systemd docker (cri-dockerd)"),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n",
                     Owner("pod", UID, CID, ""), id="v2 cgroupfs containerd"),
        pytest.param(f"0::/kubepods/pod{UID}/crio-{CID}\n",
                     Owner("pod", UID, CID, "cri-o"), id="v2 cgroupfs cri-o guaranteed"),
        pytest.param(f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UND}.slice/cri-containerd-{CID}.scope\n",
                     Owner("pod", UID, CID, "containerd"), id="kind node (kubelet.slice)"),
        pytest.param(f"0::/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UND}.slice/cri-containerd-{CID}.scope\n",
                     Owner("pod", UID, CID, "containerd"), id="seen from another cgroup namespace"),
        pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/cri-containerd-{CID}.scope\n",
                     Owner("pod", STATIC, CID, "containerd"), id="static pod (hash UID)"),
        pytest.param(
            f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
            Owner("pod", UID, CID, ""), id="v1 cgroupfs (hybrid host)"),
        pytest.param(
            f"11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UND}.slice/docker-{CID}.scope\n"
            "1:name=systemd:/system.slice/docker.service\n",
            Owner("pod", UID, CID, "docker"), id="v1 systemd docker: the pod line wins over the unit"),
        pytest.param("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
                     Owner("job", "4242"), id="slurm v2 job step"),
        pytest.param("4:devices:/slurm/uid_1000/job_77/step_batch/task_0\n1:name=systemd:/system.slice/slurmd.service\n",
                     Owner("job", "77"), id="slurm v1 job step"),
        pytest.param("0::/system.slice/ollama.service\n", Owner("unit", "ollama.service"), id="systemd service"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", Owner("unit", "session-3.scope"), id="login session"),
        pytest.param(f"0::/system.slice/docker-{CID}.scope\n", Owner("container", CID, CID, "docker"), id="docker outside Kubernetes"),
        pytest.param(f"0::/machine.slice/libpod-{CID}.scope/container\n", Owner("unit", f"libpod-{CID}.scope"), id="podman's inner cgroup: its scope"),
        pytest.param("0::/\n", Owner("other"), id="root cgroup"),
        pytest.param("0::/init.scope\n", Owner("unit", "init.scope"), id="init"),
        pytest.param("", Owner("other"), id="empty file (a zombie)"),
        pytest.param("0::/kubepods.slice/kubepods-burstable.slice\n", Owner("other"), id="QoS slice itself: no pod"),
        pytest.param("0::/system.slice/podman.service/pod1234\n", Owner("unit", "podman.service"), id="'pod' with a short id is no pod"),
        pytest.param("0::/user.slice/job_search.service\n", Owner("unit", "job_search.service"), id="job_ prefix without a number is no job"),
    ],
)
def test_owner_from_cgroup_file(text: str, owner: Owner) -> None:
    assert cgroups.parse(text) == owner


def test_pod_uid_only_for_pods() -> None:
    assert Owner("pod", UID).pod_uid == UID
    assert Owner("job", "7").pod_uid == ""


def test_a_gone_process_has_no_owner(tmp_path) -> None:
    assert cgroups.owner_of(HostPaths(procfs=str(tmp_path)), 123456) is None


@pytest.mark.privileged
def test_a_process_in_a_systemd_style_pod_cgroup_v2() -> None:
    cid = "ab" * 32
    rel = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UND}.slice/cri-containerd-{cid}.scope"
    with process_in_cgroup("cgroup2", rel) as pid:
        assert cgroups.owner_of(HostPaths(), pid) == Owner("pod", UID, cid, "containerd")


@pytest.mark.privileged
def test_a_process_in_a_cgroupfs_style_pod_cgroup_v1() -> None:
    cid = "cd" * 32
    with process_in_cgroup("cgroup", f"kubepods/besteffort/pod{UID}/{cid}", option="pids") as pid:
        assert cgroups.owner_of(HostPaths(), pid) == Owner("pod", UID, cid, "")
