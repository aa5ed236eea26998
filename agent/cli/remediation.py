"""``agent remediation status|unretire``: the ladder's record, by hand.

``unretire`` is how an operator returns a repaired node to service: it
clears the retired mark and the reboots that led to it from the state dir
(the agent must be stopped: it holds the state dir's lock; exit 3 while it
runs). The agent's next start takes the NeedsHardwareRepair-style condition
and label off the Node. See docs/remediation.md, "Un-retire a node".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..remediation.record import RECORD_FILE
from ..statedir import StateDir
from .shared import Parser


def register(sub: Any) -> None:
    p = sub.add_parser("remediation", help="show the remediation record, or un-retire this node")
    actions = p.add_subparsers(dest="remediation_command", metavar="ACTION", parser_class=Parser)
    actions.required = True
    for name, text, func in (
        ("status", "print the ladder's record (JSON): the step, reboots, retired", cmd_status),
        ("unretire", "clear the retired mark and its reboot history (stop the agent first)", cmd_unretire),
    ):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("--state-dir", metavar="DIR", help="state directory (default: the config's agent.state_dir)")
        a.add_argument("--config", metavar="FILE", help="config file (default: the embedded config/agent.toml)")
        a.set_defaults(func=func)


def _state(args: argparse.Namespace) -> StateDir:
    from ..runtime import Overrides, load_config, state_dir

    cfg = load_config(Overrides(config_path=args.config, state_dir=args.state_dir))
    return StateDir(state_dir(cfg, explicit=bool(args.state_dir)))


def cmd_status(args: argparse.Namespace) -> int:
    rec = _state(args).load(RECORD_FILE)
    json.dump(rec.to_json() if rec else None, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_unretire(args: argparse.Namespace) -> int:
    state = _state(args)
    state.ensure()
    state.lock()  # StateDirLocked (exit 3) while the agent runs
    rec = state.load(RECORD_FILE)
    if rec is None or not rec.unretired():
        print("this node is not retired; nothing to do")
        return 0
    state.write_json(RECORD_FILE.name, rec.to_json())
    print("un-retired: the retired mark and the reboot history are cleared; start the agent "
          "(it takes the condition and label off the Node)")
    return 0
