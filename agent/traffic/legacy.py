"""The iptables-legacy backend: ``iptables-legacy-save`` to read,
python-iptables (libiptc) to change.

libiptc replaces a whole table at commit, so a change made by someone else
between our read and our commit would be lost: iptables-legacy, kube-proxy
and CNIs serialise on the xtables lock file (``/run/xtables.lock``, or
``$XTABLES_LOCKFILE``; `iptables -w` waits on it), and so do we, from the dump
a plan is made from to the commit. python-iptables does not take it itself.
In a container the lock file must be the host's (kube-proxy mounts
/run/xtables.lock the same way).

python-iptables loads iptables' extension libraries (``libxt_comment.so``)
from ``XTABLES_LIBDIR``; without it, it asks ``/sbin/ldconfig -N -v`` and
fails to import where that finds nothing. We find the directory ourselves
and import python-iptables (~20 MB) only when the legacy backend changes
something.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import logging
import os
import sysconfig
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .rules import COMMENT_PREFIX, TABLE, Doomed, Plan, Spec
from .tools import TIMEOUT, NotPermitted, TrafficError, Unavailable, run, tool

log = logging.getLogger(__name__)

EXTENSION = "libxt_comment.so"  # the one extension our rules use
LOCK_FILE = "/run/xtables.lock"  # XT_LOCK_NAME in iptables' xshared.c


def _loaded_libxtables_dir() -> str | None:
    """Directory of libxtables as the dynamic loader resolves it (its
    ``xtables/`` subdirectory is where iptables was built to look)."""
    name = ctypes.util.find_library("xtables")
    if not name:
        return None
    try:
        ctypes.CDLL(name)
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libxtables.so" in path:
                    return os.path.dirname(path)
    except OSError:
        return None
    return None


def libdir_candidates() -> list[str]:
    out = [d for d in os.environ.get("XTABLES_LIBDIR", "").split(":") if d]
    loaded = _loaded_libxtables_dir()
    if loaded:
        out.append(os.path.join(loaded, "xtables"))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:  # Debian, Ubuntu
        out += [f"/usr/lib/{multiarch}/xtables", f"/lib/{multiarch}/xtables"]
    # Fedora/RHEL/SUSE, Arch/Alpine, source builds
    out += ["/usr/lib64/xtables", "/lib64/xtables", "/usr/lib/xtables", "/lib/xtables", "/usr/local/lib/xtables"]
    return out


def find_libdir(candidates: Sequence[str] | None = None) -> str | None:
    """The first directory holding libxt_comment.so."""
    for d in libdir_candidates() if candidates is None else candidates:
        if os.path.isfile(os.path.join(d, EXTENSION)):
            return d
    return None


def load_iptc() -> Any:
    """Import python-iptables with XTABLES_LIBDIR pointing at a directory that works."""
    libdir = find_libdir()
    if libdir is None:
        raise Unavailable(
            f"python-iptables needs iptables' extension directory (with {EXTENSION}): none found in "
            f"$XTABLES_LIBDIR or {', '.join(libdir_candidates())}; install iptables or set XTABLES_LIBDIR"
        )
    if os.environ.get("XTABLES_LIBDIR") != libdir:
        log.debug("XTABLES_LIBDIR=%s for python-iptables", libdir)
        os.environ["XTABLES_LIBDIR"] = libdir  # python-iptables takes one directory, not a list
    try:
        import iptc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise Unavailable(f"python-iptables is not installed ({exc}): pip install python-iptables") from None
    except Exception as exc:  # noqa: BLE001 - ctypes and XTablesError at import time
        raise Unavailable(f"python-iptables failed to load with XTABLES_LIBDIR={libdir}: {exc}") from None
    return iptc


@contextlib.contextmanager
def xtables_lock(timeout: float = TIMEOUT) -> Iterator[None]:
    path = os.environ.get("XTABLES_LOCKFILE") or LOCK_FILE
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TrafficError(f"cannot open the xtables lock {path}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TrafficError(f"the xtables lock {path} stayed held by another program for {timeout:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


class LegacyBackend:
    name = "legacy"
    needs_raw_socket = True  # libiptc talks to the kernel over a raw socket

    def missing(self, family: str) -> str | None:
        if tool(self.name, family, "save") is None:
            ipt = "iptables" if family == "ipv4" else "ip6tables"
            return f"{ipt}-legacy-save not found (install iptables with the legacy tools)"
        return None

    def save(self, family: str, existing_only: bool = False) -> bytes:
        """With counters. `existing_only`: every table that exists, without
        naming mangle, which would make the kernel create it."""
        argv = tool(self.name, family, "save")
        if argv is None:
            raise Unavailable(self.missing(family) or "no save tool")
        return run([*argv, "-c", *(() if existing_only else ("-t", TABLE))])

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return xtables_lock()

    def apply(self, family: str, plan: Plan) -> None:
        """Carry out `plan`, made from a dump taken under the lock we hold, in one commit."""
        iptc = load_iptc()
        v6 = family == "ipv6"
        try:
            with _only_mangle(iptc.Table6 if v6 else iptc.Table):
                table = (iptc.Table6 if v6 else iptc.Table)(TABLE, autocommit=False)
                table.refresh()
                _Change(iptc, table, v6).run(plan)
                table.commit()
        except (iptc.IPTCError, iptc.XTablesError, ValueError) as exc:
            text = f"python-iptables: {exc}"
            raise (NotPermitted(text) if "Permission denied" in text else TrafficError(text)) from None


@contextlib.contextmanager
def _only_mangle(table_cls: Any) -> Iterator[None]:
    """python-iptables resolves a jump target by looking for the chain in every
    table it finds "available", and finding out opens each one, which makes
    the kernel create the legacy filter, nat, raw and security tables where
    the host has none. Its cache of that answer is pinned to mangle alone
    while we work, and restored afterwards."""
    known = table_cls.existing_table_names
    saved = dict(known)
    known.update({t: t == TABLE for t in table_cls.ALL})
    try:
        yield
    finally:
        known.clear()
        known.update(saved)


class _Change:
    def __init__(self, iptc: Any, table: Any, v6: bool) -> None:
        self.iptc, self.table, self.v6 = iptc, table, v6

    def run(self, plan: Plan) -> None:
        for chain, _ in plan.rebuild:  # all in place first: one may jump to another
            if self.table.is_chain(chain):
                self.table.flush_entries(chain)
            else:
                self.table.create_chain(chain)
        for chain, specs in plan.rebuild:
            for spec in specs:
                self.iptc.Chain(self.table, chain).append_rule(self.rule(spec))
        for doomed in sorted(plan.delete, key=lambda d: (d.chain, -d.position)):
            self.delete(doomed)
        for chain, spec in plan.append:
            self.iptc.Chain(self.table, chain).append_rule(self.rule(spec))
        for chain, spec in reversed(plan.insert):
            self.iptc.Chain(self.table, chain).insert_rule(self.rule(spec), 0)
        for chain in plan.drop:
            self.table.flush_entries(chain)
            self.table.delete_chain(chain)

    def rule(self, spec: Spec) -> Any:
        r = (self.iptc.Rule6 if self.v6 else self.iptc.Rule)()
        if spec.src:
            r.src = spec.src
        if spec.dst:
            r.dst = spec.dst
        if spec.iif:
            r.in_interface = spec.iif
        if spec.oif:
            r.out_interface = spec.oif
        r.create_match("comment").comment = spec.comment
        target = self.iptc.Target(r, spec.target)  # "" is the standard target that only counts
        for name, value in zip(spec.target_opts[::2], spec.target_opts[1::2], strict=True):
            target.set_parameter(name.removeprefix("--"), value)  # e.g. CLASSIFY's set-class
        r.target = target
        return r

    def delete(self, doomed: Doomed) -> None:
        """Delete rule #index of the chain, after checking that it is still ours."""
        entry = self.table.first_rule(doomed.chain)
        for _ in range(doomed.position - 1):
            entry = self.table.next_rule(entry) if entry else None
        if not entry:
            raise TrafficError(f"{doomed.chain} #{doomed.position} is gone (the ruleset changed under the lock)")
        chain = self.iptc.Chain(self.table, doomed.chain)
        rule = self.table.create_rule(entry, chain)
        if not any(m.name == "comment" and str(m.comment).startswith(COMMENT_PREFIX) for m in rule.matches):
            raise TrafficError(f"{doomed.chain} #{doomed.position} is not ours any more (the ruleset changed under the lock)")
        chain.delete_rule(rule)
