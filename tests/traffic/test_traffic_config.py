"""[checks.traffic]: ranges are refused with one line naming file and key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent import config


def check(tmp_path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "agent", "config", "check", str(path)], check=False, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(
    ("ranges", "key", "expected"),
    [
        pytest.param('["10.0.0.0/33"]', "checks.traffic.internal_ranges[0]", "expected a network", id="bad prefix"),
        pytest.param('["10.1.2.3/8"]', "checks.traffic.internal_ranges[0]", "host bits set", id="host bits"),
        pytest.param('["10.0.0.0/8", "cluster"]', "checks.traffic.internal_ranges[1]", "expected a network",
                     id="not an address"),
        pytest.param('["10.0.0.0/8", "10.0.0.0/8"]', "checks.traffic.internal_ranges", "twice", id="duplicate"),
        pytest.param('"10.0.0.0/8"', "checks.traffic.internal_ranges", "expected a list", id="not a list"),
    ],
)
def test_bad_ranges(tmp_path, ranges: str, key: str, expected: str) -> None:
    res = check(tmp_path, f"[checks.traffic]\ninternal_ranges = {ranges}\n")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and expected in lines[0], res.stderr


def test_bad_backend(tmp_path) -> None:
    res = check(tmp_path, '[checks.traffic]\nbackend = "iptables"\n')
    assert res.returncode == 2 and 'one of "auto", "legacy", "nft"' in res.stderr


def test_ipv4_and_ipv6_ranges(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[checks.traffic]\ninternal_ranges = ["10.0.0.0/8", "100.64.0.0/10", "fd00::/8"]\nbackend = "nft"\n')
    cfg = config.load(str(path)).checks["traffic"]
    assert cfg.internal_ranges == ("10.0.0.0/8", "100.64.0.0/10", "fd00::/8") and cfg.backend == "nft"


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        pytest.param('namespace_defaults = { "batch" = "fast" }', "checks.traffic.shaping.namespace_defaults.batch",
                     'got "fast"', id="bad namespace default"),
        pytest.param('namespace_defaults = { "batch" = "1k" }', "checks.traffic.shaping.namespace_defaults.batch",
                     "between 8k and 10T", id="rate too low"),
        pytest.param('annotation = "a b"', "checks.traffic.shaping.annotation", "annotation key", id="bad annotation"),
        pytest.param('interfaces = ["eth0:1"]', "checks.traffic.shaping.interfaces[0]", "interface name",
                     id="bad interface"),
        pytest.param("qdisc_major = 65535", "checks.traffic.shaping.qdisc_major", "at most", id="major ffff"),
    ],
)
def test_bad_shaping(tmp_path, line: str, key: str, expected: str) -> None:
    res = check(tmp_path, f"[checks.traffic.shaping]\nenabled = true\n{line}\n")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and expected in lines[0], res.stderr
