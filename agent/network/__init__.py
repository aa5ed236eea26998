"""Network: link state (netlink), error and drop rates (/proc/net/dev), and
reachability of targets (name resolution and a TCP connect).

- `settings`: the ``[checks.network]`` section; `catalog`: its reasons and metrics;
- `monitor`: the engine the check (`agent.checks.network`) runs;
- `links` (netlink, pyroute2 imported only when it runs), `counters`, `reach`.
"""
