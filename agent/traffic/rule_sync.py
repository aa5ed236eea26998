"""Read ours from a backend, compare with what we want, repair.

The dump is read without a lock (the common case finds nothing to do). When
something must change, the dump is read again under the backend's lock and
the plan made from that one is carried out, so the positions it names are the
ones the change sees; then the result is read back.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from .. import native
from .detect import Backend, backend_named
from .rules import FAMILIES, Current, Desired, Plan, plan_for, plan_remove
from .tools import TrafficError


@dataclass(frozen=True, slots=True)
class Outcome:
    family: str
    before: Current
    after: Current  # == before when nothing was changed
    found: Plan  # what was wrong when first read (empty: all in place)
    applied: Plan | None  # what was carried out, None when nothing was
    remaining: Plan  # what is still wrong afterwards

    @property
    def in_place(self) -> bool:
        return not self.remaining


def new_generation() -> str:
    return secrets.token_hex(4)


def read(backend: Backend, family: str, existing_only: bool = False) -> Current:
    return Current.of(native.parse_iptables_save(backend.save(family, existing_only)))


def reconcile(backend: Backend, family: str, want: Desired | None, *, mutate: bool) -> Outcome:
    """Make `family` hold exactly `want` (nothing of ours when None); with
    `mutate` False only report. Raises TrafficError."""
    gen = new_generation()
    # Unless rules are to be installed, do not make legacy create a mangle table to look into.
    existing_only = want is None or not mutate
    cur = read(backend, family, existing_only)
    found = plan_for(want, cur, gen)
    if not found or not mutate:
        return Outcome(family, cur, cur, found, None, found)
    with backend.locked():
        fresh = read(backend, family, existing_only)
        plan = plan_for(want, fresh, gen)
        if plan:
            backend.apply(family, plan)
    after = read(backend, family, existing_only)
    return Outcome(family, cur, after, found, plan or None, plan_for(want, after, gen))


def remove(backend: Backend, family: str) -> Outcome:
    """Leave nothing of ours in `family`."""
    return reconcile(backend, family, None, mutate=True)


def has_ours(backend: Backend, family: str) -> bool:
    return bool(plan_remove(read(backend, family, existing_only=True)))


def stray_places(backend: Backend, configured: Iterable[str]) -> list[tuple[Backend, str]]:
    """Where nothing of ours may be: the other backend, and families without internal ranges."""
    other = backend_named("nft" if backend.name == "legacy" else "legacy")
    places: list[tuple[Backend, str]] = [(other, f) for f in FAMILIES if other.missing(f) is None]
    places += [(backend, f) for f in FAMILIES if f not in configured and backend.missing(f) is None]
    return places


def clear_strays(backend: Backend, configured: Iterable[str], *, mutate: bool) -> tuple[list[str], list[str]]:
    """Remove ours from `stray_places`: (what was done, what failed), one line each."""
    done, failed = [], []
    for place, family in stray_places(backend, list(configured)):
        where = f"iptables-{place.name} {family}"
        try:
            if not has_ours(place, family):
                continue
            if not mutate:
                done.append(f"rules of ours in {where} would be removed")
                continue
            out = remove(place, family)
            if not out.in_place:
                raise TrafficError(f"still there after removal: {'; '.join(out.remaining.notes)}")
            done.append(f"removed the rules of ours from {where}")
        except TrafficError as exc:
            failed.append(f"cannot remove the rules of ours from {where}: {exc}")
    return done, failed
