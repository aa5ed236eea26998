"""Runs inside a network namespace (`ip netns exec NS python netns_runner.py CONFIG STATE_DIR`):
builds the network check once, then runs it for every "run" line on stdin and
prints the observation as one JSON line (plus open fds and live threads)."""

from __future__ import annotations

import json
import os
import sys
import threading

from agent.runtime import Overrides, build_checks, load_config


def main() -> None:
    config, state_dir = sys.argv[1], sys.argv[2]
    cfg = load_config(Overrides(config_path=config))
    [(check, _)] = build_checks(cfg, state_dir, ["network"])
    known = sorted(check.known_findings())  # type: ignore[attr-defined]
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        obs = check.run()
        out = {
            "findings": [f.as_dict() for f in obs.findings],
            "samples": [{"name": s.name, "labels": dict(s.labels), "value": s.value} for s in obs.samples],
            "subjects": dict(obs.subjects),
            "known": known,
            "fds": len(os.listdir("/proc/self/fd")),
            "threads": threading.active_count(),
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
