"""What /metrics renders.

A prometheus-client custom collector renders the store's latest snapshot: a
scrape never runs or waits on a check. The findings the checks know of are
exported at 0 from start (the critical ones by default: `RenderOptions`), so
"no problem" differs from "not reporting". The HTTP server is in `agent.web`.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import platform
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from . import __version__, native, statedir
from .catalog import Catalog
from .findings import Labels, Sample, Severity, gpu_of
from .store import Snapshot, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What a render leaves out or folds (``[metrics]`` exclude, nvlink_per_link,
    findings_at_zero). The defaults render everything, as the checks made it."""

    exclude: tuple[str, ...] = ()
    nvlink_per_link: bool = True
    findings_at_zero: str = "all"  # all | critical | none

    @classmethod
    def of(cls, section: Any) -> RenderOptions:
        """From the config's ``[metrics]`` section."""
        return cls(tuple(section.exclude), bool(section.nvlink_per_link), str(section.findings_at_zero))


EVERYTHING = RenderOptions()

# Per-link NVLink families and the per-GPU family each folds into (the link label summed away).
NVLINK_PER_GPU = {
    "node_health_gpu_nvlink_up": "node_health_gpu_nvlink_links_active",
    "node_health_gpu_nvlink_errors_total": "node_health_gpu_nvlink_gpu_errors_total",
    "node_health_gpu_nvlink_bytes_total": "node_health_gpu_nvlink_gpu_bytes_total",
}


@functools.lru_cache(maxsize=8)
def _excluded(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


class RenderDrops:
    """What renders skipped because the catalog does not declare it: counted
    (``node_health_render_dropped_total``) and named in the log once per name,
    so one typo on a rare code path costs its own series, never the scrape.
    Checks' samples are checked where they are made (`Catalog.check_observation`);
    this catches what reaches the store by another path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self._named: set[str] = set()

    def drop(self, what: str, why: str) -> None:
        with self._lock:
            self.total += 1
            first = what not in self._named
            if first and len(self._named) < 1000:  # names come from code: a bounded set
                self._named.add(what)
        (log.error if first else log.debug)("/metrics skips %s: %s", what, why)


class AgentCollector:
    def __init__(self, store: Store, catalog: Catalog, drops: RenderDrops | None = None,
                 options: RenderOptions = EVERYTHING) -> None:
        self._store, self._catalog = store, catalog
        self._drops = drops or RenderDrops()
        self._options = options

    def collect(self) -> Iterator[Metric]:
        return iter(render_families(self._store.snapshot(), self._catalog, self._drops, self._options))


class AgentRegistry(CollectorRegistry):
    """The agent's collector and the process collector. `text()` renders the
    plain text format itself, with the same bytes as
    ``prometheus_client.exposition.generate_latest(registry)`` at a fraction of
    its cost (a busy node has ~2,000 series); other formats (OpenMetrics) go
    through prometheus_client as they are."""

    def __init__(self, store: Store, catalog: Catalog, options: RenderOptions = EVERYTHING) -> None:
        super().__init__(auto_describe=False)
        self.store = store
        self.process = ProcessCollector(registry=None)
        self.drops = RenderDrops()
        self.renderer = TextRenderer(catalog, self.drops, options)
        self.register(AgentCollector(store, catalog, self.drops, options))
        self.register(self.process)

    def text(self) -> bytes:
        return self.renderer.render(self.store.snapshot()).encode() + generate_latest(self.process)


# What the HTTP server types its registry as, without importing prometheus_client itself.
Registry = CollectorRegistry


def encode(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The /metrics body and its content type for a scraper's Accept header
    (Prometheus text or OpenMetrics, as prometheus_client negotiates it)."""
    encoder, ctype = choose_encoder(accept)
    if encoder is generate_latest and isinstance(registry, AgentRegistry):
        return registry.text(), ctype
    return encoder(registry), ctype


def build_registry(store: Store, catalog: Catalog, options: RenderOptions = EVERYTHING) -> AgentRegistry:
    """The registry /metrics serves: every series of `store`, described by `catalog`, as `options` trim it."""
    return AgentRegistry(store, catalog, options)


# metric → [(labels, value)]: labels as (name, value) pairs, like `Sample.labels`; their
# values go to the catalog's label names in order, as `add_metric` takes them.
Series = dict[str, list[tuple[Labels, float]]]


def collect_series(snap: Snapshot, catalog: Catalog, drops: RenderDrops | None = None,
                   options: RenderOptions = EVERYTHING) -> Series:
    """Every series of the snapshot, grouped by metric, in exposition order, as `options`
    trim them; what the catalog does not declare is skipped and counted in `drops`."""
    drops = drops or RenderDrops()
    fams: Series = {}

    def add(name: str, labels: Labels, value: float) -> None:
        series = fams.get(name)
        if series is None:
            series = fams[name] = []
        series.append((labels, value))

    uses_native = str(native.IMPLEMENTATION == "native").lower()
    build = (("version", __version__), ("native", uses_native), ("python", platform.python_version()))
    add("node_health_build_info", build, 1)
    for parser, count in native.fallbacks().items():
        add("node_health_native_fallback_total", (("parser", parser),), count)
    add("node_health_start_time_seconds", (), snap.started)
    add("node_health_scheduler_last_tick_timestamp_seconds", (), snap.last_tick)
    for name, n in statedir.rejected().items():
        add("node_health_state_file_rejected_total", (("file", name),), n)
    for name, n in statedir.ignored().items():
        add("node_health_state_file_ignored_total", (("file", name),), n)
    dropped = fams["node_health_render_dropped_total"] = []  # its value once this render's drops are known
    for name, st in snap.checks.items():
        lab = (("check", name),)
        add("node_health_check_success", lab, 1 if st.ok else 0)
        add("node_health_check_duration_seconds", lab, st.duration)
        add("node_health_check_last_run_timestamp_seconds", lab, st.finished_at)
        add("node_health_check_runs_total", lab, st.runs)
        add("node_health_check_failures_total", lab, st.failures)
        add("node_health_check_timeouts_total", lab, st.timeouts)
        add("node_health_check_skipped_total", lab, st.skipped)
        add("node_health_check_stuck", lab, 1 if st.stuck else 0)
    findings: list[tuple[Labels, float]] = [
        ((("check", c), ("subject", s), ("reason", r), ("severity", sev), ("gpu", gpu_of(s))), v)
        for (c, s, r, sev), v in _findings(snap, catalog, drops, options.findings_at_zero).items()
    ]
    if findings:
        fams["node_health_finding"] = findings
    shapes = {name: spec.labels for name, spec in catalog.metrics.items()}
    # Checks' samples were checked label by label where they were made (the
    # scheduler); here the bulk of a scrape pays only for a name and a count.
    for st in snap.checks.values():
        _add_samples(fams, catalog, shapes, st.samples, drops, exact=False)
    for samples in (*snap.event_samples.values(), *snap.extra.values()):
        _add_samples(fams, catalog, shapes, samples, drops, exact=True)
    dropped.append(((), drops.total))
    if not options.nvlink_per_link:
        _fold_nvlink(fams)
    excluded = _excluded(options.exclude)
    if excluded is not None:
        for name in [n for n in fams if excluded.match(n)]:
            del fams[name]
    return fams


def _fold_nvlink(fams: Series) -> None:
    """Each per-link NVLink family summed over its links, per GPU (and counter or direction)."""
    for per_link, per_gpu in NVLINK_PER_GPU.items():
        series = fams.pop(per_link, None)
        if not series:
            continue
        sums: dict[Labels, float] = {}
        for labels, value in series:
            key = tuple(pair for pair in labels if pair[0] != "link")
            sums[key] = sums.get(key, 0.0) + value
        fams[per_gpu] = list(sums.items())


def _add_samples(
    fams: Series,
    catalog: Catalog,
    shapes: Mapping[str, tuple[str, ...]],
    samples: Iterable[Sample],
    drops: RenderDrops,
    *,
    exact: bool,
) -> None:
    for sample in samples:
        labels = sample.labels
        names = shapes.get(sample.name)
        if names is None or len(names) != len(labels) or (exact and tuple([k for k, _ in labels]) != names):
            drops.drop(f"metric {sample.name}", catalog.sample_problem(sample) or "")
            continue
        series = fams.get(sample.name)
        if series is None:
            series = fams[sample.name] = []
        series.append((labels, sample.value))


def _findings(snap: Snapshot, catalog: Catalog, drops: RenderDrops,
              at_zero: str = "all") -> dict[tuple[str, str, str, str], int]:
    reasons = catalog.reasons
    series: dict[tuple[str, str, str, str], int] = {}

    def known(check: str, subject: str, reason: str) -> None:
        entry = reasons.get(reason)
        if entry is None:
            drops.drop(f"reason {reason}", f"finding reason {reason!r} of check {check} is not in the catalog")
        elif at_zero == "all" or (at_zero == "critical" and entry.severity is Severity.CRITICAL):
            series[(check, subject, reason, entry.severity.value)] = 0

    for name, st in snap.checks.items():
        for subject, reason in st.known:
            known(name, subject, reason)
    for triples in snap.events_known.values():
        for check, subject, reason in triples:
            known(check, subject, reason)
    for f in snap.findings():
        if f.reason not in reasons:
            drops.drop(f"reason {f.reason}", f"finding reason {f.reason!r} of check {f.check} is not in the catalog")
            continue
        series[(f.check, f.subject, f.reason, f.severity.value)] = 1
    return series


def _family(name: str, catalog: Catalog) -> Any:
    spec = catalog.metric(name)
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return cls(name, spec.help, labels=list(spec.labels))


def render_families(snap: Snapshot, catalog: Catalog, drops: RenderDrops | None = None,
                    options: RenderOptions = EVERYTHING) -> list[Metric]:
    out = []
    for name, series in collect_series(snap, catalog, drops, options).items():
        fam = _family(name, catalog)
        for labels, value in series:
            fam.add_metric([v for _, v in labels], value)
        out.append(fam)
    return out


class TextRenderer:
    """The text format (0.0.4) of `render_families`, byte for byte what
    `generate_latest` writes for it: HELP and TYPE, labels sorted by name,
    label values escaped, values as Go prints floats.

    A series' name and labels rarely change from one scrape to the next (the
    subjects stay), so their formatted text is kept from the last render, and
    only from the last: a subject that went away is dropped with it."""

    def __init__(self, catalog: Catalog, drops: RenderDrops | None = None, options: RenderOptions = EVERYTHING) -> None:
        self.catalog = catalog
        self._prefixes: dict[str, dict[Labels, str]] = {}  # metric → labels → "name{...} "
        self._drops = drops or RenderDrops()
        self._options = options

    def render(self, snap: Snapshot) -> str:
        kept: dict[str, dict[Labels, str]] = self._prefixes
        prefixes: dict[str, dict[Labels, str]] = {}
        out: list[str] = []
        for name, series in collect_series(snap, self.catalog, self._drops, self._options).items():
            spec = self.catalog.metric(name)
            if spec.kind == "counter":  # CounterMetricFamily's naming: the family without "_total", samples with it
                name = name.removesuffix("_total") + "_total"
            doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {spec.kind}\n")
            old, new = kept.get(name, {}), prefixes.setdefault(name, {})
            for labels, value in series:
                prefix = old.get(labels)
                if prefix is None:
                    prefix = _prefix(name, spec.labels, labels)
                new[labels] = prefix
                out.append(f"{prefix}{_go_float(value)}\n")
        self._prefixes = prefixes
        return "".join(out)


def _prefix(name: str, names: tuple[str, ...], labels: Labels) -> str:
    if len(names) == 1 and len(labels) == 1:  # most series: one subject label
        return f'{name}{{{names[0]}="{_escape(labels[0][1])}"}} '
    pairs = sorted(zip(names, [v for _, v in labels]))  # as `add_metric` pairs them, sorted by label name
    if not pairs:
        return f"{name} "
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "} "


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _go_float(value: float) -> str:
    """`floatToGoString`: Python's shortest repr, in Go's exponent form from 1e6 up."""
    v = float(value)
    text = repr(v)
    dot = text.find(".")
    if dot > 6 and v > 0:  # as floatToGoString writes it ("1234567.0" -> "1.234567e+06")
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    if text[-1] in "fn":  # inf, -inf, nan
        return floatToGoString(v)  # type: ignore[no-untyped-call,no-any-return]
    return text
