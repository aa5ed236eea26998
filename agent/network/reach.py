"""Reachability of "host:port" targets: name resolution and a TCP connect.

Each target is probed through `agent.probe.Prober`, all of them at once, so a
resolver that does not answer costs one thread and is reported, and never
holds up the run. The connect is a bare TCP handshake, closed at once: against
a TLS server (the Kubernetes API server) this is one failed handshake on its
side, which kube-apiserver logs only at -v=5 and counts in
apiserver_tls_handshake_errors_total (tlsHandshakeErrorWriter in
https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/server/secure_serving.go),
hence `connect_interval`.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..probe import Prober
from ..schema import host_port, split_host_port

log = logging.getLogger(__name__)

# One prober for the process: a probe still hung when the check is rebuilt (SIGHUP)
# keeps its key, so a dead resolver costs one thread per target, not one per reload.
PROBER = Prober("network")
# The probe enforces connect_timeout itself; the prober waits this much longer
# before calling it hung (getaddrinfo has no timeout of its own).
GRACE = 0.5

_ERRNO_TEXT = {
    errno.ECONNREFUSED: "connection refused",
    errno.ENETUNREACH: "network unreachable (no route)",
    errno.EHOSTUNREACH: "no route to host",
    errno.ECONNRESET: "connection reset",
    errno.EACCES: "blocked by a local firewall rule",
    errno.EPERM: "blocked by a local firewall rule",
}


def target(value: str) -> str | None:
    """Config validator for a target: ``host:port``, IPv6 in brackets (``[::1]:443``)."""
    problem = host_port(value)
    if problem:
        return problem
    host, _ = split_host_port(value)
    bracketed = value.startswith("[")
    if not host or any(c.isspace() for c in host) or (bracketed and not _is_ipv6(host)):
        return f'expected "host:port" with a host name or address (IPv6 in brackets), got "{value}"'
    return None


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def default_targets(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """In a pod: the API server's service address (set by the kubelet in every container)."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return ()
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if target(text) is not None:
        log.warning("ignoring KUBERNETES_SERVICE_HOST/PORT: %s is not a host:port", text)
        return ()
    return (text,)


@dataclass(slots=True)
class _Progress:
    started: bool = False
    stage: str = "resolving the name"
    address: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    target: str
    reachable: bool | None  # None: an earlier probe is still stuck, nothing known
    seconds: float = 0.0  # resolution and connect
    detail: str = ""  # the address reached, the error, or what is stuck


# Progress of probes that ran past their deadline, by target: what the next run reports while they are stuck.
_STUCK: dict[str, _Progress] = {}


def probe_all(targets: Sequence[str], timeout: float) -> list[Outcome]:
    if not targets:
        return []
    # one worker per target: all finish within timeout + GRACE, whatever their number
    with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="network-probe") as pool:
        return list(pool.map(lambda t: probe(t, timeout), targets))


def probe(text: str, timeout: float) -> Outcome:
    """One probe. A probe that runs past its budget is a timeout (getaddrinfo has no
    timeout of its own: a resolver that does not answer in time is a DNS timeout);
    while that call is still running, later probes of the target are not started
    and report it as stuck (unknown)."""
    host, port = split_host_port(text)
    progress = _Progress()
    res = PROBER.call(text, lambda: _connect(host, port, timeout, progress), timeout + GRACE)
    if res.hung_for is None:
        _STUCK.pop(text, None)
    elif progress.started:
        _STUCK[text] = progress
        what = "DNS resolution" if not progress.address else f"connect ({progress.address})"
        return Outcome(text, False, detail=f"{what} timed out after {timeout:g}s")
    else:
        stuck = _STUCK.get(text, progress)
        where = f" {stuck.address}" if stuck.address else ""
        detail = f"the previous probe is still {stuck.stage}{where} after {res.hung_for:.1f}s; not probed again until it returns"
        return Outcome(text, None, detail=detail)
    if res.error is not None:
        return Outcome(text, False, detail=describe(res.error, timeout, progress))
    return Outcome(text, True, seconds=float(res.value or 0.0), detail=progress.address)


def _connect(host: str, port: int, timeout: float, progress: _Progress) -> float:
    progress.started = True
    start = time.monotonic()
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    progress.stage = "connecting to"
    error: OSError = TimeoutError()
    for family, kind, proto, _, addr in infos:
        remaining = start + timeout - time.monotonic()
        if remaining <= 0:
            raise TimeoutError()
        progress.address = str(addr[0])
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(remaining)
            try:
                sock.connect(addr)
            except OSError as exc:
                error = exc
                continue
        return time.monotonic() - start
    raise error


def describe(exc: BaseException, timeout: float, progress: _Progress) -> str:
    """The error as an SRE would say it: refused, timed out, no route, DNS failure."""
    at = f" ({progress.address})" if progress.address else ""
    if isinstance(exc, socket.gaierror):
        return f"DNS resolution failed: {exc.strerror or exc}"
    if isinstance(exc, TimeoutError):
        return f"connect timed out after {timeout:g}s{at}"
    if isinstance(exc, OSError) and exc.errno in _ERRNO_TEXT:
        return f"{_ERRNO_TEXT[exc.errno]}{at}"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{at}"
    return f"{type(exc).__name__}: {exc}"
