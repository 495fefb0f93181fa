"""Example workloads for the node agent (used by tests and benchmarks)."""
