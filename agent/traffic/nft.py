"""The iptables-nft backend: ``iptables-nft-save`` to read, one
``iptables-nft-restore --noflush`` batch to change (kube-proxy's way).

A restore batch is one nf_tables transaction: it applies whole or not at all.
With ``--noflush`` nothing but what the batch names is touched; a
``:CHAIN - [0:0]`` line flushes that chain if it exists (creates it
otherwise), so it is written only for our own chains, and never for a
built-in one, where it would also set the policy.

``nft -j list ruleset`` is no use here: iptables-nft 1.8 stores ``-m comment``
as an xtables match expression, which nft prints as ``{"xt": {"type":
"match", "name": "comment"}}`` without the text, so our rules cannot be found
by their comment there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .rules import TABLE, Plan, checked_line
from .tools import Unavailable, run, tool


class NftBackend:
    name = "nft"
    needs_raw_socket = False

    def missing(self, family: str) -> str | None:
        for action in ("save", "restore"):
            if tool(self.name, family, action) is None:
                ipt = "iptables" if family == "ipv4" else "ip6tables"
                return f"{ipt}-nft-{action} not found (install iptables 1.8+ with the nft tools)"
        return None

    def save(self, family: str, existing_only: bool = False) -> bytes:
        """The mangle table with counters (listing creates nothing in nf_tables)."""
        return run([*self._tool(family, "save"), "-c", "-t", TABLE])

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield  # a restore batch is one transaction: no lock file

    def apply(self, family: str, plan: Plan) -> None:
        run([*self._tool(family, "restore"), "--noflush"], stdin=restore_batch(plan).encode())

    def _tool(self, family: str, action: str) -> tuple[str, ...]:
        argv = tool(self.name, family, action)
        if argv is None:
            raise Unavailable(self.missing(family) or f"no {action} tool")
        return argv


def restore_batch(plan: Plan) -> str:
    lines = [f"*{TABLE}"]
    lines += [f":{chain} - [0:0]" for chain, _ in plan.rebuild]  # all declared first: one may jump to another
    for chain, specs in plan.rebuild:
        lines += [f"-A {chain} {s.restore_text()}" for s in specs]
    for d in sorted(plan.delete, key=lambda d: (d.chain, -d.position)):
        lines.append(checked_line(f"-D {d.chain} {d.rule}"))
    lines += [f"-A {chain} {spec.restore_text()}" for chain, spec in plan.append]
    for chain, spec in reversed(plan.insert):
        lines.append(f"-I {chain} 1 {spec.restore_text()}")
    lines += [f"-F {chain}" for chain in plan.drop]  # all flushed before any is deleted: one may jump to another
    lines += [f"-X {chain}" for chain in plan.drop]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"
