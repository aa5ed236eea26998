"""A fake Kubernetes API server for the agent's tests and benchmarks.

It answers every call the agent makes the way kube-apiserver does (see
shared/reference/kubernetes.md §10): resourceVersion preconditions and 409,
the three patch types with 415/422/400, strategic merge by merge key,
watches with bookmarks and the in-stream 410, Events (both APIs) with their
validation, Leases under a ResourceQuota (403 "exceeded quota"), 401/403,
injectable 429 (APF's plain text, a Status, or without Retry-After) and 5xx,
pods (field selectors, graceful deletion, a pod stuck past its grace period),
PodDisruptionBudgets with the disruption controller's status, the eviction
subresource with kube-apiserver's answers (201, 429, 404, 500), and a
request log. Served over HTTP on loopback for the real ``kubernetes``
client, or in-process (`FakeApiServer.pool`) for the fleet simulation.
"""

from .cluster import Cluster, Request
from .server import USER, Apf, FakeApiServer, Fault, InProcessPool, Record
from .workloads import EVICT_MSG, MIRROR, MULTI_PDB_MSG, Workloads

__all__ = ["EVICT_MSG", "MIRROR", "MULTI_PDB_MSG", "USER", "Apf", "Cluster", "FakeApiServer", "Fault", "InProcessPool",
           "Record", "Request", "Workloads"]
