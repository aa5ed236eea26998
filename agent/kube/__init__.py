"""Kubernetes: findings become taints, conditions and events on this node.

Reading order: `settings` (the ``[kubernetes]`` config), `hysteresis` (when a
finding counts, persisted), `policy` (pure: active findings → desired node
state), `api` (every request, one rate limit and one backoff), `reconciler`
(makes the Node match, step by step), `actuator` (the threads and the hook
into the daemon). Only `api`/`connect` import the ``kubernetes`` package, and
only once a cluster is configured. `catalog` declares the reasons and
metrics of the feature.
"""

from __future__ import annotations

SOURCE = "kubernetes"  # check name of the findings the actuator reports about itself
