"""Trace loaders: Philly, Pollux workloads, Alibaba 2023, and Shaper's own CSV/JSON.

:func:`load_trace` picks the loader from ``kind`` or, when ``kind="auto"``, from the file's
name and header.
"""

from __future__ import annotations

import csv
from pathlib import Path

from sim.traces.alibaba import load_alibaba, read_alibaba_nodes, read_alibaba_pods
from sim.traces.common import TraceOptions
from sim.traces.native import load_native
from sim.traces.philly import load_philly, read_philly
from sim.traces.pollux import load_pollux, read_pollux
from sim.workload import Workload

KINDS = ("auto", "philly", "pollux", "alibaba", "native")

__all__ = [
    "KINDS",
    "TraceOptions",
    "detect_kind",
    "load_alibaba",
    "load_native",
    "load_philly",
    "load_pollux",
    "load_trace",
    "read_alibaba_nodes",
    "read_alibaba_pods",
    "read_philly",
    "read_pollux",
]


def detect_kind(path: str | Path) -> str:
    path = Path(path)
    if path.suffix == ".json":
        return "native"
    with open(path, newline="") as handle:
        header = set(next(csv.reader(handle), []))
    if {"timestamp", "duration", "num_gpus"} <= header:
        return "philly"
    if {"application", "num_replicas"} <= header:
        return "pollux"
    if {"num_gpu", "gpu_milli", "qos"} <= header:
        return "alibaba"
    if {"submit_s", "gpus", "duration_s"} <= header:
        return "native"
    raise ValueError(f"{path}: cannot tell the trace format from its header {sorted(header)}")


def load_trace(
    path: str | Path,
    *,
    kind: str = "auto",
    options: TraceOptions | None = None,
    nodes_path: str | Path | None = None,
) -> Workload:
    """Load any supported trace. Alibaba pods need ``nodes_path`` (default: the
    ``openb_node_list_all_node.csv`` next to the pod list)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; one of {KINDS}")
    if kind == "auto":
        kind = detect_kind(path)
    if kind == "pollux":
        return load_pollux(path, options)
    options = options or TraceOptions()
    if kind == "philly":
        return load_philly(path, options)
    if kind == "alibaba":
        nodes = (
            Path(nodes_path) if nodes_path else Path(path).with_name("openb_node_list_all_node.csv")
        )
        return load_alibaba(nodes, path, options)
    return load_native(path, options)
