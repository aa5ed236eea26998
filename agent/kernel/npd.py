"""node-problem-detector's kernel-monitor rules as patterns of the fault table,
for `agent scan-log --patterns FILE` (try an NPD user's existing rules on a
saved log) and as a starting point for ``[checks.kernel.patterns.<name>]``.

NPD matches a rule's regular expression against the end of its log buffer
(`pattern` + ``\\z``), anywhere in the message: a converted pattern is
``.*?(?:pattern)\\s*\\Z``, matched from the start as the table does. A
``temporary`` rule (an event) becomes a warning held an hour; a
``permanent`` rule (a node condition) a critical finding held until the node
reboots. Every converted pattern keeps the rule's own reason (``OOMKilling``,
``TaskHung``): the condition's reason and the taint's value, as under NPD;
the condition type is the agent's (``<prefix>KernelProblem``), whatever the
rule's ``condition``. Its action is ``none``: the agent acts on no rule it was
not written for. `to_toml` writes the rules as ``[checks.kernel.patterns.<name>]``
tables an operator can paste into the config.
"""

from __future__ import annotations

import json
import re

from ..findings import Severity
from .catalog import HOUR, PATTERNS, FaultPattern, reason_problem
from .patterns import Table, check_regex


class NpdError(ValueError):
    """A file that is not a usable kernel-monitor configuration; the message names the key."""


def _name(reason: str, taken: set[str]) -> str:
    base = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", reason).lower()
    base = re.sub(r"[^a-z0-9_]", "_", base)[:56] or "npd_rule"
    name, n = f"npd_{base}"[:64], 2
    while name in taken:
        name, n = f"npd_{base}_{n}"[:64], n + 1
    taken.add(name)
    return name


def patterns(data: bytes) -> list[FaultPattern]:
    """The rules of a kernel-monitor.json, in file order. Raises NpdError."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise NpdError(f"expected a JSON kernel-monitor configuration ({exc})") from None
    rules = doc.get("rules") if isinstance(doc, dict) else None
    if not isinstance(rules, list):
        raise NpdError('rules: expected a list of rules ({"type", "reason", "pattern"})')
    taken = {p.name for p in PATTERNS}
    out = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            raise NpdError(f"rules[{i}]: expected an object")
        kind, reason, pattern = rule.get("type"), rule.get("reason"), rule.get("pattern")
        if kind not in ("temporary", "permanent"):
            raise NpdError(f'rules[{i}].type: expected "temporary" or "permanent", got {json.dumps(kind)}')
        if not isinstance(reason, str) or not reason:
            raise NpdError(f"rules[{i}].reason: expected a name, got {json.dumps(reason)}")
        problem = reason_problem(reason)
        if problem:
            raise NpdError(f"rules[{i}].reason: {problem}")
        if not isinstance(pattern, str) or not pattern:
            raise NpdError(f"rules[{i}].pattern: expected a regular expression, got {json.dumps(pattern)}")
        converted = rf".*?(?:{pattern})\s*\Z"
        problem = check_regex(converted)
        if problem:
            raise NpdError(f"rules[{i}].pattern: {problem}")
        permanent = kind == "permanent"
        out.append(FaultPattern(
            _name(reason, taken), reason, Severity.CRITICAL if permanent else Severity.WARNING, "none",
            converted, hold=None if permanent else HOUR,
            summary=f"node-problem-detector {kind} rule {reason}" + (f" (condition {rule['condition']})" if rule.get("condition") else ""),
        ))
    return out


def with_rules(table: Table, data: bytes) -> Table:
    """`table` with a kernel-monitor.json's rules added after its patterns (a message both
    match keeps the table's verdict, as an operator's pattern does)."""
    return Table([*table.patterns, *patterns(data)])


def to_toml(data: bytes) -> str:
    """The rules of a kernel-monitor.json as ``[checks.kernel.patterns.<name>]`` tables (the agent's
    config), in file order, each with a comment naming its rule. Raises NpdError."""
    out = []
    for p in patterns(data):
        hold = "boot" if p.hold is None else "1h"
        out.append(
            f"# {re.sub(r'[^ -~]', '?', p.summary)}\n[checks.kernel.patterns.{p.name}]\n"
            f"pattern = {_toml_str(p.pattern)}\nreason = {_toml_str(p.reason)}\n"
            f'severity = "{p.severity.value}"\naction = "{p.action}"\nhold = "{hold}"\n'
        )
    return "\n".join(out)


def _toml_str(text: str) -> str:
    """A TOML literal string when it can be one (a regex reads as written), else a basic string."""
    if "'" not in text and "\n" not in text and all(" " <= c != "\x7f" or c == "\t" for c in text):
        return f"'{text}'"
    return json.dumps(text)  # JSON's escapes are TOML's for these characters
