"""``agent rules show|install|remove``: the traffic accounting rules by hand.

The internal ranges and the default backend come from ``[checks.traffic]``
of the config (``--config``). ``show`` prints what the count rules themselves
hold (they start at 0 when created); the monotonic totals are the agent's
``node_health_traffic_*_total`` metrics. ``remove`` without ``--backend``
removes ours from both backends. A running agent puts removed rules back
within one interval: disable the check first. ``remove`` also gives the
kernel back every root qdisc that shaping took over (htb ``qdisc_major``:).
Per-pod rules are wanted for the ``[checks.traffic.pods] static`` entries
only (the CLI has no pod watch): ``install`` by hand on a cluster node takes
the pods' rules out until the agent's next run puts them back (their counts
carry on, less what was counted between the agent's last read and the install).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import Any

from ..traffic.detect import Backend, backend_named, resolve
from ..traffic.perpod import from_static, sub_chains
from ..traffic.rule_sync import clear_strays, has_ours, read, reconcile, remove
from ..traffic.rules import CHAINS, DIRECTIONS, FAMILIES, Current, Desired, Network, desired, plan_for
from ..traffic.tc import TcError, give_back_everywhere
from ..traffic.tools import CAP_NET_ADMIN, CAP_NET_RAW, TrafficError, missing_caps
from .shared import Parser, config_flag, config_path


def register(sub: Any) -> None:
    rules = sub.add_parser("rules", help="show, install or remove the traffic accounting rules")
    actions = rules.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=Parser)
    actions.required = True
    for name, text, func in (
        ("show", "print the rules' counters (and whether they are in place)", cmd_show),
        ("install", "install or repair the rules (idempotent)", cmd_install),
        ("remove", "remove every rule and chain of ours (and nothing else)", cmd_remove),
    ):
        p = actions.add_parser(name, help=text, description=text)
        config_flag(p)
        p.add_argument("--backend", choices=("auto", "legacy", "nft"), help="default: [checks.traffic] backend")
        if name == "show":
            p.add_argument("--json", action="store_true", help="one JSON object")
        p.set_defaults(func=func)


def _config(args: argparse.Namespace) -> Any:
    from ..config import load

    return load(config_path(args.config)).checks["traffic"]


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"agent rules {args.rules_command}: error: {message}", file=sys.stderr)
    return 1


def _privileged(args: argparse.Namespace, backend: Backend | None = None) -> bool:
    needed = (CAP_NET_ADMIN, CAP_NET_RAW) if backend is not None and backend.needs_raw_socket else (CAP_NET_ADMIN,)
    missing = missing_caps(needed)
    if missing:
        _fail(args, f"needs {' and '.join(missing)} (run as root)")
    return not missing


def _desired(cfg: Any, family: str, nets: list[Network]) -> Desired | None:
    subs = sub_chains(family, from_static(cfg.pods.static)) if cfg.pods.enabled else ()
    return desired(family, nets, subs)


def _families(backend: Backend) -> list[str]:
    return [f for f in FAMILIES if backend.missing(f) is None]


def cmd_show(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if not _privileged(args):
        return 1
    nets = [ipaddress.ip_network(r) for r in cfg.internal_ranges]
    try:
        backend, why = resolve(args.backend or cfg.backend)
        if not _privileged(args, backend):
            return 1
        found = {f: read(backend, f, existing_only=True) for f in _families(backend)}
    except TrafficError as exc:
        return _fail(args, str(exc))
    rows = [row for f, cur in found.items() for row in _rows(f, cur)]
    if args.json:
        json.dump({"backend": backend.name, "rules": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"backend: iptables-{backend.name} ({why})")
    for family, cur in found.items():
        want = _desired(cfg, family, nets)
        plan = plan_for(want, cur, "")
        if want is None:
            state = "no internal range, no rules wanted" + ("; but some of ours are there" if plan else "")
        else:
            state = "in place" if not plan else "not in place: " + "; ".join(plan.notes)
        print(f"{family}: {state}")
    if rows:
        print(f"\n{'FAMILY':<7} {'NAME':<13} {'CHAIN':<25} {'PACKETS':>14} {'BYTES':>18}")
        for r in rows:
            print(f"{r['family']:<7} {r['name']:<13} {r['chain']:<25} {r['packets']:>14} {r['bytes']:>18}")
    return 0


def _rows(family: str, cur: Current) -> list[dict[str, Any]]:
    out = []
    for direction in DIRECTIONS:
        rec = cur.count_rule(direction)
        if rec is not None:
            out.append({"name": direction, "family": family, "chain": CHAINS[direction], "bytes": rec.bytes,
                        "packets": rec.packets})
    return out


def cmd_install(args: argparse.Namespace) -> int:
    cfg = _config(args)
    nets = [ipaddress.ip_network(r) for r in cfg.internal_ranges]
    if not _privileged(args):
        return 1
    try:
        backend, why = resolve(args.backend or cfg.backend)
        if not _privileged(args, backend):
            return 1
        wanted = {f: w for f in FAMILIES if (w := _desired(cfg, f, nets)) is not None}
        done, failed = clear_strays(backend, wanted, mutate=True)
        for family, want in wanted.items():
            out = reconcile(backend, family, want, mutate=True)
            if not out.in_place:
                failed.append(f"{family}: still not in place: {'; '.join(out.remaining.notes)}")
            elif out.applied is None:
                done.append(f"{family}: already in place in iptables-{backend.name}")
            else:
                verb = "installed" if out.before.empty else "repaired"
                done.append(f"{family}: {verb} in iptables-{backend.name} ({why})")
    except TrafficError as exc:
        return _fail(args, str(exc))
    print("\n".join(done))
    return _fail(args, "; ".join(failed)) if failed else 0


def cmd_remove(args: argparse.Namespace) -> int:
    choice = args.backend or "auto"
    backends = [backend_named(n) for n in ("legacy", "nft")] if choice == "auto" else [backend_named(choice)]
    if not _privileged(args, backends[0] if len(backends) == 1 else None):
        return 1  # with both backends, a missing CAP_NET_RAW shows as legacy's own error
    lines = []
    try:
        for backend in backends:
            for family in _families(backend):
                if not has_ours(backend, family):
                    continue
                out = remove(backend, family)
                if not out.in_place:
                    return _fail(args, f"{family}: still there: {'; '.join(out.remaining.notes)}")
                lines.append(f"{family}: removed from iptables-{backend.name}")
        major = _config(args).shaping.qdisc_major
        lines += [f"{dev}: root qdisc given back to the kernel" for dev in give_back_everywhere(major)]
    except (TrafficError, TcError) as exc:
        return _fail(args, str(exc))
    print("\n".join(lines) if lines else "nothing of ours was installed")
    return 0
