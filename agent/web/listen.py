"""The /metrics address: resolved, bound, and what a failure means.

Light on imports on purpose: the CLI catches `ListenError` before anything
heavy (the parsers, prometheus_client) is loaded.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from ..config import ConfigError, split_host_port


class ListenError(Exception):
    """The address cannot be served: one line, and the exit code that says
    whether trying again can help (2: no, the config must change; 3: yes)."""

    def __init__(self, key: str, detail: str, exit_code: int) -> None:
        super().__init__(f"{key}: {detail}")
        self.detail, self.exit_code = detail, exit_code


def resolve_listen(listen: str, key: str) -> tuple[int, tuple[Any, ...]]:
    """(family, sockaddr) for ``host:port``; an empty host is every IPv4 address."""
    host, port = split_host_port(listen)
    try:
        infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        again = exc.errno in (socket.EAI_AGAIN,)
        raise ListenError(key, f'cannot resolve "{host}": {exc.strerror}', 3 if again else 2) from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def bind_error(listen: str, key: str, exc: OSError) -> ListenError:
    if exc.errno == errno.EACCES:
        return ListenError(
            key, f"cannot listen on {listen}: permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)", 2
        )
    if exc.errno == errno.EADDRINUSE:
        return ListenError(key, f"cannot listen on {listen}: the address is already in use", 3)
    return ListenError(key, f"cannot listen on {listen}: {exc.strerror or exc}", 3)


def check_listen(listen: str, source: str) -> None:
    """What `agent config check` can know of the address before binding: it resolves."""
    try:
        resolve_listen(listen, "metrics.listen")
    except ListenError as exc:
        raise ConfigError(source, "metrics.listen", exc.detail) from None
