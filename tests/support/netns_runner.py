"""Runs inside a network namespace (`ip netns exec NS python netns_runner.py CONFIG STATE_DIR [CHECK]`):
builds the check (default: network) once, then runs it for every "run" line on stdin and
prints the observation as one JSON line (plus open fds and live threads).

A "pods JSON" line (a list of `agent.pods.PodAddr` fields, or null for "not known") sets the
pods the check sees in `CheckContext.pods` (a static view standing in for the pod watch)."""

from __future__ import annotations

import json
import os
import sys
import threading

from collections.abc import Sequence

from agent.check import CheckContext
from agent.pods import PodAddr
from agent.runtime import Overrides, build_enabled, host_paths, load_config


class StaticPods:
    """A PodView whose pods the test sets."""

    def __init__(self) -> None:
        self._pods: tuple[PodAddr, ...] | None = ()
        self._gen = 0

    def set(self, pods: Sequence[PodAddr] | None) -> None:
        self._pods = None if pods is None else tuple(pods)
        self._gen += 1

    def pods(self) -> Sequence[PodAddr] | None:
        return self._pods

    def generation(self) -> int:
        return self._gen


def main() -> None:
    config, state_dir = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "network"
    cfg = load_config(Overrides(config_path=config))
    view = StaticPods()
    ctx = CheckContext(paths=host_paths(cfg), state_dir=state_dir, config=cfg, pods=view)
    [(check, _)] = build_enabled(ctx, [name])
    known = sorted(check.known_findings())  # type: ignore[attr-defined]
    for line in sys.stdin:
        if line.startswith("pods "):
            raw = json.loads(line[5:])
            view.set(None if raw is None else [PodAddr(**{**p, "ips": tuple(p["ips"])}) for p in raw])
            continue
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
