"""The sysfs formats as the kernel writes them (drivers/infiniband/core/sysfs.c), and near-misses."""

from __future__ import annotations

import pytest

from agent.infiniband.sysfs import parse_counter, parse_rate, parse_state


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: ACTIVE_DEFER", (5, "ACTIVE_DEFER")),
        ("5: LinkUp\n", (5, "LinkUp")),
        ("7: Phy Test", (7, "Phy Test")),
        ("4: PortConfigurationTraining", (4, "PortConfigurationTraining")),
        ("0: <unknown>", (0, "<unknown>")),
        ("ACTIVE", None),
        ("4 ACTIVE", None),
        ("x: ACTIVE", None),
        ("4: ACTIVE: 5", None),
        ("-1: DOWN", None),
        ("", None),
    ],
)
def test_state_and_phys_state(text: str, want: tuple[int, str] | None) -> None:
    assert parse_state(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2.5 Gb/sec (1X SDR)\n", 2.5),
        ("10 Gb/sec (4X QDR)", 10.0),
        ("56 Gb/sec (4X FDR)", 56.0),
        ("100 Gb/sec (4X EDR)", 100.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("800 Gb/sec (4X XDR)", 800.0),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("400 Gb/s (4X NDR)", None),
        ("Gb/sec", None),
        ("fast Gb/sec (4X NDR)", None),
        ("-1 Gb/sec (4X NDR)", None),
        ("", None),
    ],
)
def test_rate(text: str, want: float | None) -> None:
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"0\n", 0),
        (b"65535\n", 65535),
        (b"18446744073709551615\n", 2**64 - 1),
        (b"N/A (no PMA)\n", None),
        (b"-1\n", None),
        (b"12a\n", None),
        (b"", None),
    ],
)
def test_counter(data: bytes, want: int | None) -> None:
    assert parse_counter(data) == want
