"""The traffic engine: what the traffic check does on each run (see `agent.checks.traffic`)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..findings import ObservationBuilder, Severity
from ..parsers.iptsave import KIND_RULE
from ..pods import Refused, vet
from .datapath import Verdict, Witness, cilium_routing, default_route, jump_bytes
from .detect import Backend, resolve
from .perpod import CHAINS as POD_CHAINS
from .perpod import TAGS, Counted, from_pods, from_static, is_pod_tally, sub_chains, tally_key
from .rule_sync import Outcome, clear_strays, read, reconcile
from .rules import DIRECTIONS, FAMILIES, Current, Desired, SubChain, count_key, desired, family_of, generation
from .shaper import Shaper
from .shaping import assigned
from .tally import Tallies
from .tools import (
    CAP_NET_ADMIN,
    CAP_NET_RAW,
    ErrorLog,
    NotPermitted,
    TrafficError,
    Unavailable,
    forget_tools,
    missing_caps,
    tool,
)

if TYPE_CHECKING:
    from ..check import CheckContext
    from ..pods import PodAddr, PodView
    from .settings import TrafficConfig

log = logging.getLogger(__name__)

SUBJECT = "iptables"
DATAPATH = "datapath"
PODS = "pods"


class Keeper:
    def __init__(self, ctx: CheckContext, cfg: TrafficConfig) -> None:
        self.nets = [ipaddress.ip_network(r) for r in cfg.internal_ranges]
        self.per_pod = cfg.pods.enabled
        self.pod_view: PodView | None = ctx.pods if self.per_pod else None
        # every feature that writes rules per pod reads the pods; what is refused of them is reported here, once
        self.any_view: PodView | None = ctx.pods if self.per_pod or cfg.shaping.enabled else None
        self.vetted_from: tuple[PodAddr, ...] | None = None
        self.refused: tuple[Refused, ...] = ()
        # without a cluster, the configured networks; with one, the pods as last known
        self.counted: tuple[Counted, ...] = from_static(cfg.pods.static) if self.per_pod and ctx.pods is None else ()
        self.pods_known = True  # False while the pod view says it does not know
        self.last_pods: tuple[PodAddr, ...] | None = None
        self._counted_changed()
        self.wanted: dict[str, Desired] = {
            f: w for f in FAMILIES if (w := desired(f, self.nets, self.pod_subs[f])) is not None
        }
        self.shaper = Shaper(cfg.shaping, ctx.pods, ctx.state_dir, ctx.dry_run)
        self.choice = cfg.backend
        self.dry_run = ctx.dry_run
        self.state_dir = ctx.state_dir
        self.backend: Backend | None = None
        self.why = ""
        self.tallies: Tallies | None = None  # read on the first run, not at build time (reloads)
        self.strays_cleared = False
        self.in_place: dict[str, bool] = {}
        self.seen_in_place = {f: False for f in FAMILIES}
        self.errors = ErrorLog(log, "traffic")
        self.paths, self.cilium_socket = ctx.paths, cfg.cilium_socket
        self.witness = Witness(cfg.datapath_window, cfg.datapath_min_bytes)
        self.verdict: Verdict | None = None
        self.jumps: dict[Hashable, int] = {}  # our jump rules' byte counters, this run
        forget_tools()  # built at start and on every reload

    def known_findings(self) -> list[tuple[str, str]]:
        out = [(SUBJECT, r) for r in ("NotApplicable", "InsufficientPrivilege", "TrafficBackendUnavailable")]
        out += [(f, "TrafficFamilyNotCounted") for f in FAMILIES if f not in self.wanted]
        out.append((DATAPATH, "TrafficDatapathBypass"))
        if self.pod_view is not None:
            out.append((PODS, "PodTrafficUnknown"))
        out += self.shaper.known_findings()
        return out + [(f, r) for f in self.wanted for r in ("InsufficientPrivilege", "TrafficRulesNotInPlace")]

    def run(self, b: ObservationBuilder) -> None:
        if self.tallies is None:
            self.tallies = Tallies(self.state_dir)
        try:
            self._refuse(b)
            self._families(b)
            self._pods(b)
            backend = self._prepare(b)
            if backend is not None:
                self.jumps = {}
                self._want(self.shaper.begin(b, lambda: self._shaped(backend)))
                for family in self.wanted:
                    self._family(b, backend, family)
                self.shaper.end(b)
                if self.jumps:
                    self._datapath(b)
                self._forget_pods()
        finally:
            self.shaper.close()
            self._export(b)
            if not self.dry_run:
                try:
                    self.tallies.save()
                except OSError as exc:
                    self._error("save", f"cannot write the traffic counters to {self.state_dir}: {exc}")

    # ------------------------------------------------------------ backend

    def _prepare(self, b: ObservationBuilder) -> Backend | None:
        if missing_caps((CAP_NET_ADMIN,)):
            self._problem(b, SUBJECT, "InsufficientPrivilege", "traffic accounting needs CAP_NET_ADMIN to read and "
                          "keep its iptables rules (run as root or grant the capability); counters are held")
            return None
        if not any(tool(m, "ipv4", "save") or tool(m, "ipv6", "save") for m in ("legacy", "nft")):
            b.finding(SUBJECT, "NotApplicable", "no iptables tools on this host: traffic is not counted")
            return None
        if self.backend is None:
            self.backend, self.why = resolve(self.choice)
            log.info("traffic accounting uses iptables-%s (%s)", self.backend.name, self.why)
        backend = self.backend
        problem = next((p for f in self.wanted if (p := backend.missing(f))), None)
        if problem:
            self._problem(b, SUBJECT, "TrafficBackendUnavailable", f"iptables-{backend.name} ({self.why}): {problem}")
            return None
        if backend.needs_raw_socket and missing_caps((CAP_NET_RAW,)):
            self._problem(b, SUBJECT, "InsufficientPrivilege", "iptables-legacy needs CAP_NET_RAW as well as "
                          "CAP_NET_ADMIN (libiptc talks to the kernel over a raw socket); counters are held")
            return None
        self._recovered(SUBJECT)
        if not self.strays_cleared:
            self._clear_strays(backend)
        b.subject(SUBJECT, f"iptables-{backend.name} ({self.why})")
        return backend

    def _want(self, subs: Mapping[str, Sequence[SubChain]]) -> None:
        """What each family must hold this run: the accounting rules, the per-pod chains and the sub-features'
        chains (hung after the per-pod ones)."""
        for family in list(self.wanted):
            want = desired(family, self.nets, (*self.pod_subs[family], *subs.get(family, ())))
            if want is not None:
                self.wanted[family] = want

    def _shaped(self, backend: Backend) -> dict[str, int]:
        """Pod uid -> class minor, from the shaping rules in place (so a restart keeps every pod's class)."""
        out: dict[str, int] = {}
        for family in self.wanted:
            try:
                out.update(assigned(read(backend, family, existing_only=True), self.shaper.major))
            except TrafficError as exc:
                log.debug("cannot read the shaping rules of %s: %s", family, exc)
        return out

    # ------------------------------------------------------------ what is counted per pod

    def _counted_changed(self) -> None:
        self.pod_subs = {f: sub_chains(f, self.counted) if self.per_pod else () for f in FAMILIES}
        counted_families = {family_of(n) for n in self.nets}
        self.pod_rules = sum(len(s.rules) for f in counted_families for s in self.pod_subs[f])
        # per counted pod and direction, the tallies of its rules (its addresses in the families we count)
        self.pod_tallies = [
            (c, {d: [tally_key(TAGS[d], family_of(n), c.key(n)) for n in c.nets if family_of(n) in counted_families]
                 for d in DIRECTIONS})
            for c in self.counted
        ]

    def _pods(self, b: ObservationBuilder) -> None:
        """Take the pods in when they changed; their rules follow in this run."""
        view = self.pod_view
        if view is None:
            return
        pods = view.pods()
        if pods is None:
            self.pods_known = False
            self._problem(b, PODS, "PodTrafficUnknown", "the node's pods are not known: per-pod internet traffic "
                          "is unknown (series withheld); the rules of the pods last known count on")
            return
        self.pods_known = True
        self._recovered(PODS)
        snapshot = tuple(pods)  # compared, not the view's generation: cheap, and right whatever order it bumps in
        if snapshot == self.last_pods:
            return
        self.last_pods = snapshot
        counted, _ = from_pods(snapshot)  # what is refused is reported by _refuse
        if counted != self.counted:
            self.counted = counted
            self._counted_changed()

    def _families(self, b: ObservationBuilder) -> None:
        """Each family counted or not, as a metric; a family left out (no internal range of it) while the node
        has a default route of it or a pod an address of it is a finding: its internet traffic is neither counted
        nor shaped, and that is said, never silent."""
        pods = self.vetted_from or ()
        for family in FAMILIES:
            counted = family in self.wanted
            b.sample("node_health_traffic_family_counted", 1 if counted else 0, family=family)
            if counted:
                continue
            version = 4 if family == "ipv4" else 6
            routed = default_route(self.paths, version)
            addressed = sum(1 for p in pods if not p.host_network and any(_version(ip) == version for ip in p.ips))
            if not routed and not addressed:
                continue
            why = ", ".join(w for w in ("the node has a default route of it" if routed else "",
                                        f"{addressed} pods have an address of it" if addressed else "") if w)
            b.finding(family, "TrafficFamilyNotCounted",
                      f"{family} internet traffic is neither counted nor shaped ({why}): internal_ranges holds no "
                      f"{family} range; add the cluster's {family} pod and service ranges to count it")

    def _refuse(self, b: ObservationBuilder) -> None:
        """A finding per pod or address no rule is written for (`agent.pods.vet`): never node state, and
        logged once when the pods change, not every run."""
        view = self.any_view
        pods = view.pods() if view is not None else None
        if pods is None:
            return  # unknown: PodTrafficUnknown says so; what was refused before stays refused
        snapshot = tuple(pods)
        if snapshot != self.vetted_from:
            self.vetted_from = snapshot
            refused = vet(snapshot).refused
            for r in set(refused) - set(self.refused):
                log.warning("pods: %s: %s", r.subject, r.why)
            self.refused = refused
        for r in self.refused:
            b.finding(r.subject, "TrafficPodInputRefused", r.why)

    def _forget_pods(self) -> None:
        """Tallies of rules no longer wanted (a pod that left): its series goes, and so does its state."""
        assert self.tallies is not None
        if not self.pods_known:
            return
        keep = {name for _, names in self.pod_tallies for d in DIRECTIONS for name in names[d]}
        self.tallies.forget([k for k in self.tallies.tallies if is_pod_tally(k) and k not in keep])

    def _clear_strays(self, backend: Backend) -> None:
        done, failed = clear_strays(backend, self.wanted, mutate=not self.dry_run)
        for line in done:
            log.warning("%s (this host uses iptables-%s)", line, backend.name)
        for line in failed:
            self._error("strays", line)
        if not failed:
            self._recovered("strays")
        self.strays_cleared = not failed

    # ------------------------------------------------------------ one family

    def _family(self, b: ObservationBuilder, backend: Backend, family: str) -> None:
        self.in_place[family] = False
        try:
            out = reconcile(backend, family, self.wanted[family], mutate=not self.dry_run)
        except NotPermitted as exc:
            self._problem(b, family, "InsufficientPrivilege", f"{exc}; counters are held")
            return
        except Unavailable as exc:
            self._problem(b, family, "TrafficBackendUnavailable", f"{exc}; counters are held")
            return
        except TrafficError as exc:
            self._problem(b, family, "TrafficRulesNotInPlace", f"{exc}; counters are held")
            return
        self._changed(backend, out)
        if out.applied is not None:  # what the rules counted up to the repair or rebuild is kept, not lost
            self._count(family, out.before)
        self._count(family, out.after)
        self.jumps.update(jump_bytes(family, (r for rules in out.after.rules.values() for r in rules)))
        self.in_place[family] = out.in_place
        self.seen_in_place[family] |= out.in_place
        if out.in_place:
            self._recovered(family)
            b.subject(family, self._detail(backend, family))
        elif self.dry_run:
            b.finding(family, "TrafficRulesNotInPlace", "dry run, would fix: " + "; ".join(out.found.notes),
                      severity=Severity.INFO)
        else:
            self._problem(b, family, "TrafficRulesNotInPlace",
                          "still wrong after a repair: " + "; ".join(out.remaining.notes))

    def _changed(self, backend: Backend, out: Outcome) -> None:
        if out.applied is None:
            return
        what = "; ".join(out.applied.notes)
        if self.seen_in_place[out.family] or not out.before.empty:
            assert self.tallies is not None
            self.tallies.repaired(out.family)
            log.warning("repaired the traffic rules for %s in iptables-%s: %s", out.family, backend.name, what)
        else:
            log.info("installed the traffic rules for %s in iptables-%s", out.family, backend.name)

    def _count(self, family: str, cur: Current) -> None:
        assert self.tallies is not None
        for direction in DIRECTIONS:
            rec = cur.count_rule(direction)
            if rec is None or rec.kind != KIND_RULE:
                continue
            tally = self.tallies.get(direction, family)
            if tally.observe(generation(rec.comment) or "", rec.packets, rec.bytes):
                log.info("%s %s count rule is new or was zeroed; %d bytes counted before it are kept",
                         family, direction, tally.base_bytes)
        for direction, chain in POD_CHAINS.items():
            for rec in cur.counted(chain):
                key = count_key(rec.comment)
                if key and rec.kind == KIND_RULE:
                    self.tallies.named(tally_key(TAGS[direction], family, key)).observe(
                        generation(rec.comment) or "", rec.packets, rec.bytes)

    # ------------------------------------------------------------ does netfilter see the traffic?

    def _datapath(self, b: ObservationBuilder) -> None:
        verdict = self.witness.observe(self.paths, self.jumps, v6_unruled="ipv6" not in self.wanted)
        if cilium_routing(self.paths, self.cilium_socket) == "BPF":
            unseen = verdict.unseen if verdict is not None else None
            verdict = Verdict(True, "Cilium's agent reports eBPF host routing (intra-host-routing-mode BPF): pod "
                              "traffic is routed in BPF and never reaches the host's iptables hooks", unseen)
        self.verdict = verdict
        b.sample("node_health_traffic_accounting_up", 0 if verdict is not None and verdict.bypass else 1)
        if verdict is not None and verdict.unseen is not None:
            b.sample("node_health_traffic_unseen_ratio", round(verdict.unseen, 4))
        if verdict is not None and verdict.bypass:
            b.finding(DATAPATH, "TrafficDatapathBypass", f"{verdict.why}; traffic accounting is unknown, its counters "
                      "are withheld")
            cause = "Cilium eBPF host routing" if verdict.why.startswith("Cilium") else "most bytes on the uplinks unseen"
            self._error(DATAPATH, f"traffic accounting is unknown: the datapath bypasses the iptables hooks ({cause})")
        else:
            self._recovered(DATAPATH)

    # ------------------------------------------------------------ output

    def _detail(self, backend: Backend, family: str) -> str:
        assert self.tallies is not None
        totals = ", ".join(f"{d} {_human(self.tallies.get(d, family).total_bytes)}" for d in DIRECTIONS)
        return f"rules in place (iptables-{backend.name}); {totals}"

    def _export(self, b: ObservationBuilder) -> None:
        assert self.tallies is not None
        blind = self.verdict is not None and self.verdict.bypass  # unknown, not a count that misses the traffic
        for family in self.wanted:
            for direction in DIRECTIONS if not blind else ():
                t = self.tallies.get(direction, family)
                b.sample("node_health_traffic_bytes_total", t.total_bytes, direction=direction, family=family)
                b.sample("node_health_traffic_packets_total", t.total_packets, direction=direction, family=family)
            b.sample("node_health_traffic_rules_repaired_total", self.tallies.repairs.get(family, 0), family=family)
            b.sample("node_health_traffic_rules_in_place", 1 if self.in_place.get(family) else 0, family=family)
        if self.backend is not None:
            b.sample("node_health_traffic_backend_info", 1, backend=self.backend.name)
        if self.per_pod:
            self._export_pods(b, known=self.pods_known and not blind)

    def _export_pods(self, b: ObservationBuilder, known: bool) -> None:
        """One series per counted pod and direction, its addresses summed; none at all while unknown."""
        assert self.tallies is not None
        b.sample("node_health_pod_traffic_accounting_up", 1 if known else 0)
        b.sample("node_health_pod_traffic_rules", self.pod_rules)
        if not known:
            return
        tallies = self.tallies.tallies
        for c, names in self.pod_tallies:
            for direction in DIRECTIONS if names[DIRECTIONS[0]] else ():
                nbytes = packets = 0
                for name in names[direction]:
                    t = tallies.get(name)
                    if t is not None:
                        nbytes, packets = nbytes + t.total_bytes, packets + t.total_packets
                labels = {"namespace": c.namespace, "pod": c.pod, "direction": direction}
                b.sample("node_health_pod_traffic_bytes_total", nbytes, **labels)
                b.sample("node_health_pod_traffic_packets_total", packets, **labels)

    def _problem(self, b: ObservationBuilder, subject: str, reason: str, message: str) -> None:
        b.finding(subject, reason, message)
        self._error(subject, f"traffic {subject} {reason}: {message}")

    def _error(self, key: str, message: str) -> None:
        self.errors.error(key, message)

    def _recovered(self, key: str) -> None:
        self.errors.recovered(key)


def _version(ip: str) -> int:
    try:
        return ipaddress.ip_address(ip).version
    except ValueError:
        return 0


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
