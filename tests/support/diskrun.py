"""Run the disk check repeatedly in one process inside a `MountNamespace`.

`agent selftest` runs each check once per process; what needs several runs of
the same check object (counter deltas, a hung probe not started twice) uses
this runner: one `run()` per request, each answered with one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from mountns import MountNamespace

RUNNER = """
import json, sys
from agent import config
from agent.check import CheckContext
from agent.checks.disk import SPEC
from agent.hostpaths import HostPaths

cfg = config.load(sys.argv[1])
check = SPEC.build(CheckContext(HostPaths(), sys.argv[2], cfg), cfg.checks["disk"])
print(json.dumps({"known": sorted(map(list, check.known_findings()))}), flush=True)
for _ in sys.stdin:
    obs = check.run()
    print(json.dumps({
        "findings": [f.as_dict() for f in obs.findings],
        "subjects": dict(obs.subjects),
        "samples": [[s.name, dict(s.labels), s.value] for s in obs.samples],
    }), flush=True)
"""


class CheckRunner:
    def __init__(self, ns: MountNamespace, config_path: str, state_dir: str = "/nonexistent/state") -> None:
        self.proc = ns.popen(
            [sys.executable, "-c", RUNNER, config_path, state_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1,
        )
        self.known = [tuple(k) for k in self._read()["known"]]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"the check runner exited: {err}")
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def reasons(result: dict[str, Any], subject: str) -> set[str]:
    return {f["reason"] for f in result["findings"] if f["subject"] == subject}


def sample(result: dict[str, Any], name: str, path: str) -> float | None:
    for n, labels, value in result["samples"]:
        if n == name and labels.get("mountpoint") == path:
            return float(value)
    return None
