"""Running the iptables tools: finding them, running them with a deadline,
and telling "not allowed" apart from other failures.

iptables 1.8 ships each tool twice, ``iptables-legacy-save`` and
``iptables-nft-save`` (also reachable through ``xtables-legacy-multi`` and
``xtables-nft-multi``); older hosts have only a plain ``iptables-save``, which
is legacy, and images sometimes carry only the multi binaries. Both modes
print the same ``iptables-save`` format.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from functools import cache

from ..hostpaths import read_text

SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
CAP_NET_ADMIN, CAP_NET_RAW = 12, 13  # include/uapi/linux/capability.h
TIMEOUT = 5.0  # iptables-nft 1.8.0-1.8.3 can loop forever (kubernetes-sigs/iptables-wrappers README)


class TrafficError(Exception):
    """Reading or changing the rules failed; the message says what and how."""


class Unavailable(TrafficError):
    """A backend cannot be used here: its tools or python-iptables are missing."""


class NotPermitted(TrafficError):
    """The kernel refused: the agent lacks CAP_NET_ADMIN (or CAP_NET_RAW for legacy)."""


def _search_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN_DIRS])


@cache
def tool(mode: str, family: str, action: str) -> tuple[str, ...] | None:
    """argv prefix for ``<ip|ip6>tables-<action>`` ("save", "restore", or "" for
    the plain command) in `mode` ("legacy" or "nft"), or None when absent."""
    base = ("iptables" if family == "ipv4" else "ip6tables") + (f"-{action}" if action else "")
    named = base.replace("tables", f"tables-{mode}", 1)
    path = shutil.which(named, path=_search_path())
    if path:
        return (path,)
    multi = shutil.which(f"xtables-{mode}-multi", path=_search_path())
    if multi:
        return (multi, base)
    plain = shutil.which(base, path=_search_path())
    if plain and _mode_of(plain) == mode:
        return (plain,)
    return None


def forget_tools() -> None:
    """Look the tools up again (a config reload after iptables was installed or upgraded)."""
    tool.cache_clear()
    _mode_of.cache_clear()


@cache
def _mode_of(path: str) -> str:
    """"nft" or "legacy" from ``--version`` (``iptables v1.8.9 (nf_tables)``); before 1.8 always legacy."""
    try:
        res = subprocess.run([path, "--version"], capture_output=True, timeout=TIMEOUT, env=_env(), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return "nft" if b"nf_tables" in res.stdout + res.stderr else "legacy"


def _env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def run(argv: tuple[str, ...] | list[str], stdin: bytes | None = None, timeout: float = TIMEOUT) -> bytes:
    """stdout of `argv`; TrafficError (NotPermitted when the kernel said no) otherwise."""
    shown = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
    try:
        res = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout, env=_env(), check=False)
    except subprocess.TimeoutExpired:
        raise TrafficError(f"{shown}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise Unavailable(f"{shown}: cannot run it: {exc.strerror or exc}") from None
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        detail = " / ".join(line for line in err if not line.startswith("Try `"))[-400:] or f"exit code {res.returncode}"
        if "Permission denied" in detail or "Operation not permitted" in detail:
            raise NotPermitted(f"{shown}: {detail}")
        raise TrafficError(f"{shown}: {detail}")
    return res.stdout


def effective_caps(status_path: str = "/proc/self/status") -> int | None:
    """This process's effective capability set (None when it cannot be read)."""
    text = read_text(status_path)
    for line in (text or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return None
    return None


def missing_caps(needed: tuple[int, ...], status_path: str = "/proc/self/status") -> list[str]:
    """Names of the capabilities in `needed` that this process lacks."""
    caps = effective_caps(status_path)
    if caps is None:
        return []  # cannot tell: let the tools answer
    names = {CAP_NET_ADMIN: "CAP_NET_ADMIN", CAP_NET_RAW: "CAP_NET_RAW"}
    return [names[c] for c in needed if not caps >> c & 1]


class ErrorLog:
    """Errors logged at ERROR when they first appear or change, at DEBUG while they repeat, and one INFO line
    when they go away (keyed by what they are about)."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.log, self.what = logger, what
        self.last: dict[str, str] = {}  # key -> last error logged

    def error(self, key: str, message: str) -> None:
        (self.log.debug if self.last.get(key) == message else self.log.error)("%s", message)
        self.last[key] = message

    def recovered(self, key: str) -> None:
        if self.last.pop(key, None) is not None:
            self.log.info("%s %s: working again", self.what, key)
