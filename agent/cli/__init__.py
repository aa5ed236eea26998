"""The `agent` command: `main` parses the command line (`agent.cli.main`);
each feature's commands are a module here (`gpu`, `traffic`, `burn`); what
they share (usage errors, common flags, overrides) is `agent.cli.shared`."""

from __future__ import annotations

from .main import build_parser as build_parser
from .main import main as main
