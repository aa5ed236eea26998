"""Remediation: the ladder that acts on the catalog's action for each definite finding.

Reading order: `settings` (the ``[remediation]`` config), `faults` (which
findings it acts on, and the plan for each), `record` (its memory in the
state dir), `host` (the reset, reboot, retire and power-off commands behind
seams), `cluster` (the contract with the Kubernetes side, and `NoCluster`
for bare metal), `ladder` (the state machine), `runner` (its thread and the
hook into the daemon). `catalog` declares its reasons and metrics.
"""
