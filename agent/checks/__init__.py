"""Checks: one thin adapter module per check, each declaring a `SPEC`.

An adapter (``agent/checks/<name>.py``) names the check, its config class (from
``agent/<feature>/settings.py``, the ``[checks.<name>]`` table), the reasons and
metrics it can emit (from its feature), and a `build` that makes the check;
its ``run()`` hands an `ObservationBuilder` to the feature's engine.
`agent.registry` imports every adapter by name. Adapters keep heavy imports
inside functions so that a disabled check costs nothing. See docs/architecture.md.
"""
