"""InfiniBand and RoCE ports: state, rate, error counters and their windows (docs/infiniband.md)."""
