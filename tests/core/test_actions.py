"""What a finding asks of the node: every reason declares an action, a finding carries it.

The remediation ladder acts on `Finding.action`, so an action must come from
the catalog (or, for one finding, from the data that names the cure) and be
one the ladder knows.
"""

from __future__ import annotations

import pytest

from agent.catalog import Catalog, CatalogError, Reason
from agent.findings import ACTION_TEXT, ACTIONS, ObservationBuilder, Severity
from agent.gpu import xid_catalog
from agent.gpu.catalog import CATALOG as GPU
from agent.gpu.xid_tracker import Event, XidStream
from agent.parsers.xid import KIND_XID
from agent.registry import CATALOG


def test_every_reason_of_the_application_names_a_known_action() -> None:
    assert set(ACTION_TEXT) == set(ACTIONS)
    assert {r.action for r in CATALOG.reasons.values()} <= set(ACTIONS)
    # unknown means "cannot tell": it never asks anything of the node
    assert {r.name for r in CATALOG.reasons.values() if r.unknown and r.action != "none"} == set()


def test_a_reason_with_an_action_the_ladder_does_not_know_is_refused() -> None:
    with pytest.raises(CatalogError, match="'reflash'"):
        Catalog.declare([Reason("Odd", Severity.CRITICAL, "x", action="reflash")])


def test_a_finding_takes_its_action_from_the_catalog_unless_it_names_its_own() -> None:
    cat = Catalog.declare([Reason("Sick", Severity.CRITICAL, "x", action="reboot")])
    b = ObservationBuilder("c", cat)
    assert b.finding("s", "Sick", "m").action == "reboot"
    assert b.finding("s", "Sick", "m", action="reset_gpu").action == "reset_gpu"
    assert b.finding("s", "NotApplicable", "m").action == "none"
    with pytest.raises(CatalogError):
        b.finding("s", "Sick", "m", action="nope")
    assert b.build().findings[0].as_dict()["action"] == "reboot"


def test_the_xid_reasons_carry_the_xid_catalogs_actions() -> None:
    for info in xid_catalog.catalog().values():
        assert GPU.reason(info.reason).action == info.action, info.xid
    assert GPU.reason("Xid79").action == "reboot"
    assert GPU.reason("RowRemapFailure").action == "rma"


@pytest.mark.parametrize(
    ("code", "action"), [(1, "reset_gpu"), (2, "reboot"), (3, "drain_and_diagnose"), (7, "reboot")]
)
def test_an_xid_154_finding_asks_for_the_recovery_action_its_line_names(code: int, action: str) -> None:
    stream = XidStream(
        dedupe_window=5, app_hold=300, coverage_hold=600, overrides={},
        subject_of=lambda pci, kind: (f"gpu@{pci}", "0"), clock=lambda: 100.0,
    )
    line = f"GPU recovery action changed from 0x0 (None) to 0x{code:x} (x)"
    stream.add(Event("kmsg", KIND_XID, 154, "0000:01:00.0", line, 100.0))
    (f,) = [f for f in stream.findings() if f.reason == "Xid154"]
    assert f.action == action
