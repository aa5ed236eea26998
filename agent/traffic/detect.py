"""Which iptables the host uses, decided the way kube-proxy's image decides it
(kubernetes-sigs/iptables-wrappers, v2 ``iptables-wrapper-installer.sh``):

1. kubelet (1.17+) keeps a ``KUBE-IPTABLES-HINT`` or ``KUBE-KUBELET-CANARY``
   chain in mangle: found through iptables-nft → nft;
2. found through iptables-legacy (all tables, since ``-t mangle`` would make
   the kernel create the legacy table) → legacy;
3. else count the rules (``^-`` lines of both families' saves): legacy only
   if it holds strictly more, so a tie (an empty host) goes to nft.

Unlike the wrapper we do not count our own rules: where they are follows the
decision, it must not drive it. Legacy and nft rules both run in the kernel,
so installing into the mode the host does not use would double-count nothing
but would sit outside the ordering the host's firewall expects.
"""

from __future__ import annotations

import logging
import re

from .legacy import LegacyBackend
from .nft import NftBackend
from .rules import is_our_line
from .tools import TrafficError, run, tool

log = logging.getLogger(__name__)

Backend = LegacyBackend | NftBackend
_HINT = re.compile(rb"^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)", re.MULTILINE)


def backend_named(name: str) -> Backend:
    return LegacyBackend() if name == "legacy" else NftBackend()


def _saves(mode: str, *args: str) -> bytes:
    """Both families' saves concatenated; a missing tool or a failure is empty, like the wrapper's ``|| true``."""
    out = b""
    for family in ("ipv4", "ipv6"):
        argv = tool(mode, family, "save")
        if argv is None:
            continue
        try:
            out += run([*argv, *args])
        except TrafficError as exc:
            log.debug("detection: %s", exc)
    return out


def _rule_lines(dump: bytes) -> int:
    return sum(1 for line in dump.split(b"\n") if line.startswith(b"-") and not is_our_line(line))


def detect() -> tuple[str, str]:
    """("legacy" | "nft", why)."""
    if _HINT.search(_saves("nft", "-t", "mangle")):
        return "nft", "kubelet's hint chain is in iptables-nft"
    legacy = _saves("legacy")
    if _HINT.search(legacy):
        return "legacy", "kubelet's hint chain is in iptables-legacy"
    n_legacy, n_nft = _rule_lines(legacy), _rule_lines(_saves("nft"))
    if n_legacy > n_nft:
        return "legacy", f"{n_legacy} legacy rules vs {n_nft} nft rules"
    return "nft", f"{n_nft} nft rules vs {n_legacy} legacy rules"


def resolve(choice: str) -> tuple[Backend, str]:
    """The backend for a config or --backend value, and why it was chosen."""
    if choice in ("legacy", "nft"):
        return backend_named(choice), "chosen in the configuration"
    name, why = detect()
    return backend_named(name), why
