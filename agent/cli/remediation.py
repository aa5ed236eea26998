"""``agent remediation status|unretire``: the ladder's record, by hand.

``status`` is read-only: it reads the state dir through a read-only
`StateDir` (nothing created, renamed, moved or written, a damaged record
included: it is reported, left where it is), with or without a running agent.

``unretire`` is how an operator returns a repaired node to service, on bare
metal and in the DaemonSet alike (``kubectl exec`` into the agent's pod):

- no agent runs (the state dir's lock is free): the lock is taken and the
  retired mark and the reboots that led to it are cleared from the record;
- an agent runs (it holds the lock): a request file is written next to the
  record (``remediation-unretire.json``) and the running agent applies it to
  its own record on its next tick and removes the file; the command waits
  (``--wait``, 60 s) for that. The record is only ever written by the process
  that holds the lock: the two never race.

Either way the agent then takes the NeedsHardwareRepair condition and the
retired label off the Node. See docs/remediation.md, "Un-retire a node".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..remediation.record import RECORD_FILE, UNRETIRE, UNRETIRE_FILE, VERSION
from ..statedir import StateDir, StateDirLocked
from .shared import Parser

EXIT_PENDING = 3  # the request was written but no running agent took it up in time


def register(sub: Any) -> None:
    p = sub.add_parser("remediation", help="show the remediation record, or un-retire this node")
    actions = p.add_subparsers(dest="remediation_command", metavar="ACTION", parser_class=Parser)
    actions.required = True
    for name, text, func in (
        ("status", "print the ladder's record (JSON): the step, reboots, retired (read-only)", cmd_status),
        ("unretire", "clear the retired mark and its reboot history (a running agent is asked to)", cmd_unretire),
    ):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("--state-dir", metavar="DIR", help="state directory (default: the config's agent.state_dir)")
        a.add_argument("--config", metavar="FILE", help="config file (default: the embedded config/agent.toml)")
        if name == "unretire":
            a.add_argument("--wait", metavar="SECONDS", type=float, default=60.0,
                           help="how long to wait for a running agent to take the request up (default 60)")
        a.set_defaults(func=func)


def _path(args: argparse.Namespace) -> str:
    from ..runtime import Overrides, load_config, state_dir

    cfg = load_config(Overrides(config_path=args.config, state_dir=args.state_dir))
    return state_dir(cfg, explicit=bool(args.state_dir))


def cmd_status(args: argparse.Namespace) -> int:
    state = StateDir(_path(args), read_only=True)
    rec = state.load(RECORD_FILE)
    problem = state.problems.get(RECORD_FILE.name)
    out: dict[str, Any] | None = rec.to_json() if rec else None
    if problem:
        out = {"record": None, "problem": f"{state.file(RECORD_FILE.name)}: {problem} (left where it is)"}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 1 if problem else 0


def cmd_unretire(args: argparse.Namespace) -> int:
    state = StateDir(_path(args))
    state.ensure()
    try:
        state.lock()
    except StateDirLocked:
        return _request(state, args.wait)
    rec = state.load(RECORD_FILE)
    if rec is None or not rec.unretired():
        print("this node is not retired; nothing to do")
        return 0
    state.write_json(RECORD_FILE.name, rec.to_json())
    print("un-retired: the retired mark and the reboot history are cleared; start the agent "
          "(it takes the condition and label off the Node)")
    return 0


def _request(state: StateDir, wait: float) -> int:
    """An agent runs: ask it (a request file it applies to its own record), and wait for it to."""
    state.write_json(UNRETIRE, {"version": VERSION, "at": time.time()})
    print(f"an agent runs on this state dir: un-retire requested ({state.file(UNRETIRE)}); waiting for it", flush=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if state.load(UNRETIRE_FILE) is None and not state.problems.get(UNRETIRE):
            rec = StateDir(state.path, read_only=True).load(RECORD_FILE)
            if rec is not None and rec.retired is not None:
                print("the running agent took the request up, but the node is retired (again)")
                return 1
            print("un-retired by the running agent: the retired mark and the reboot history are cleared "
                  "(it takes the condition and label off the Node)")
            return 0
        time.sleep(0.5)
    print(f"no running agent took the request up within {wait:g}s; it stays in {state.file(UNRETIRE)} "
          "and is applied when the agent next looks (it ticks every remediation.interval)", file=sys.stderr)
    return EXIT_PENDING
