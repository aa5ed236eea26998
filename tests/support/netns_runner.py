"""Runs inside a network namespace (`ip netns exec NS python netns_runner.py CONFIG STATE_DIR [CHECK [PODS]]`):
builds the check (default: network) once, then runs it for every "run" line on stdin and
prints the observation as one JSON line (plus open fds and live threads). PODS: a JSON file
of `agent.pods.PodAddr` fields, read again at every run, served as the check's PodView."""

from __future__ import annotations

import json
import os
import sys
import threading

from agent.check import CheckContext
from agent.pods import PodAddr
from agent.runtime import Overrides, build_enabled, host_paths, load_config


class FilePods:
    """A PodView over a JSON file (a list of PodAddr fields; absent file: pods unknown)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._gen = 0
        self._last: object = None

    def pods(self) -> list[PodAddr] | None:
        try:
            with open(self.path) as fh:
                raw = json.load(fh)
        except FileNotFoundError:
            return None
        if raw != self._last:
            self._gen, self._last = self._gen + 1, raw
        return [PodAddr(**{**p, "ips": tuple(p["ips"])}) for p in raw]

    def generation(self) -> int:
        return self._gen


def main() -> None:
    config, state_dir = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "network"
    pods = FilePods(sys.argv[4]) if len(sys.argv) > 4 else None
    cfg = load_config(Overrides(config_path=config))
    ctx = CheckContext(paths=host_paths(cfg), state_dir=state_dir, config=cfg, pods=pods)
    [(check, _)] = build_enabled(ctx, [name])
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
