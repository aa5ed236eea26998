"""Traffic accounting with iptables mangle rules: internet vs cluster traffic.

The agent keeps two chains of its own in the ``mangle`` table of each address
family it is given internal ranges for, jumped to from ``INPUT``, ``FORWARD``
and ``OUTPUT``; each chain RETURNs for loopback and for every internal range,
then counts what is left. Nothing here changes a packet's fate: no marks, no
verdicts, only jumps into our chains and RETURNs out of them.

- `rules`: the rules we want, how a dump compares to them, and the plan that
  makes the tables match (pure; table-tested).
- `tools`, `nft`, `legacy`, `detect`: the two iptables backends (iptables-nft
  through ``iptables-nft-restore``, iptables-legacy through python-iptables)
  and the choice between them, the way kube-proxy's iptables-wrapper makes it.
- `rule_sync`: read (``iptables-save -c``, parsed natively), compare, repair.
- `tally`: counters that stay monotonic across rule re-creation and restarts.
- `settings`: the ``[checks.traffic]`` section; `catalog`: its reasons and metrics;
  `keeper`: the engine the check (`agent.checks.traffic`) runs.
- `shaping`, `shaper`, `tc`: opt-in internet-only egress shaping per pod (CLASSIFY
  rules in a sub-chain of ours, an HTB qdisc of ours on the uplinks, via pyroute2).
- ``agent rules show|install|remove`` is in `agent.cli.traffic`.

docs/traffic.md describes the design with an example ruleset.
"""
