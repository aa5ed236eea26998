"""A pytest plugin that breaks the native parsers on purpose: every call's
strings come back with one NUL too many, as a native library that miscounts
its output would give them. Each call then falls back to the Python twin and
still returns the right records, which is exactly what the twin tests must
not let through (tests/parsers/test_parsers_fallback.py runs them under this plugin:
`python -m pytest -p break_native tests/parsers/test_parsers_twins.py ...` must fail).
"""

from __future__ import annotations

from typing import Any

from hypothesis import Phase, settings

from agent import native

_real_call = native._call


def _miscounting_call(fn: Any, data: bytes) -> tuple[int, memoryview, str]:
    records, numbers, strings = _real_call(fn, data)
    return records, numbers, strings + "\0"


native._call = _miscounting_call
# Failures are the point here: find them, do not spend minutes shrinking them.
settings.register_profile("broken-native", phases=[Phase.explicit, Phase.reuse, Phase.generate], max_examples=10)
settings.load_profile("broken-native")
