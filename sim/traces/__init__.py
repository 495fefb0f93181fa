"""Trace loaders: Philly, Pollux workloads, Alibaba 2023, Gavel, and Shaper's own CSV/JSON.

:func:`open_trace` picks the loader from ``kind`` or, when ``kind="auto"``, from the file
(:mod:`sim.traces.detect`), loads it, and says which cluster the replay runs on and where
that comes from: the trace's own node list (Alibaba, Shaper's JSON with ``nodes``), or the
setup the trace's source published unless ``TraceOptions`` sizes it
(:mod:`sim.traces.cluster`). :func:`load_trace` is the same without the explanation.
Every refusal is a :class:`TraceError` that names the input to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sim.traces import gavel, native, philly, pollux
from sim.traces.alibaba import load_alibaba, read_alibaba_nodes, read_alibaba_pods
from sim.traces.cluster import PublishedCluster, choose_cluster, describe_nodes
from sim.traces.common import Elasticity, TraceError, TraceInput, TraceOptions, check_file
from sim.traces.detect import detect_kind
from sim.traces.gavel import load_gavel, read_gavel
from sim.traces.native import load_native
from sim.traces.philly import load_philly, read_philly
from sim.traces.pollux import load_pollux, read_pollux
from sim.workload import Workload

KINDS = ("auto", "philly", "pollux", "alibaba", "native", "gavel")
# Where the Alibaba trace keeps its node list: next to the pod lists.
ALIBABA_NODE_LIST = "openb_node_list_all_node.csv"

# Traces without a node list: their loader and the cluster their source published.
LOADERS: dict[str, tuple[Callable[[Path, TraceOptions], Workload], PublishedCluster]] = {
    "philly": (load_philly, philly.CLUSTER),
    "pollux": (load_pollux, pollux.CLUSTER),
    "native": (load_native, native.CLUSTER),
    "gavel": (load_gavel, gavel.CLUSTER),
}

__all__ = [
    "ALIBABA_NODE_LIST",
    "KINDS",
    "Elasticity",
    "LoadedTrace",
    "TraceError",
    "TraceInput",
    "TraceOptions",
    "alibaba_node_list",
    "detect_kind",
    "load_alibaba",
    "load_gavel",
    "load_native",
    "load_philly",
    "load_pollux",
    "load_trace",
    "open_trace",
    "read_alibaba_nodes",
    "read_alibaba_pods",
    "read_gavel",
    "read_philly",
    "read_pollux",
]


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    kind: str
    workload: Workload
    # The replay cluster and where it comes from, e.g. "16 nodes × 4 V100 GPUs (Pollux's …)".
    cluster: str


def alibaba_node_list(pods_path: str | Path, nodes_path: str | Path | None) -> Path:
    """The node list an Alibaba pod list replays on: ``nodes_path``, else the trace's own
    ``openb_node_list_all_node.csv`` next to the pods."""
    if nodes_path is not None:
        given = Path(nodes_path)
        if given.is_dir():
            raise TraceError(
                f"node list {given} is a directory; pass the node list file itself "
                f"(e.g. {given / ALIBABA_NODE_LIST})",
                about=TraceInput.nodes,
            )
        if not given.is_file():
            raise TraceError(f"node list {given}: no such file", about=TraceInput.nodes)
        return given
    beside = Path(pods_path).with_name(ALIBABA_NODE_LIST)
    if not beside.is_file():
        raise TraceError(
            f"{pods_path} is an Alibaba pod list: its pods are placed on a node list, and "
            f"there is no {ALIBABA_NODE_LIST} next to it; pass --nodes",
            about=TraceInput.nodes,
        )
    return beside


def open_trace(
    path: str | Path,
    *,
    kind: str = "auto",
    options: TraceOptions | None = None,
    nodes_path: str | Path | None = None,
) -> LoadedTrace:
    """Load any supported trace; ``nodes_path`` is the node list of an Alibaba pod list
    (default: the one next to it)."""
    if kind not in KINDS:
        raise TraceError(
            f"unknown trace kind {kind!r}; one of {', '.join(KINDS)}", about=TraceInput.kind
        )
    path = Path(path)
    options = options or TraceOptions()
    if kind == "auto":
        kind = detect_kind(path)
    if kind == "alibaba":
        if options.gpus is not None or options.gpus_per_node is not None:
            raise TraceError(
                "an Alibaba pod list replays on its node list (--nodes), so --gpus and "
                "--gpus-per-node do not apply; leave them out",
                about=TraceInput.cluster,
            )
        check_file(path, TraceInput.trace)  # the pods before their node list
        nodes = alibaba_node_list(path, nodes_path)
        workload = load_alibaba(nodes, path, options)
        return LoadedTrace(kind, workload, f"{describe_nodes(workload.nodes)} (node list {nodes})")
    if nodes_path is not None:
        raise TraceError(
            f"--nodes is the node list of an Alibaba pod list; {path} is a {kind} trace",
            about=TraceInput.nodes,
        )
    load, published = LOADERS[kind]
    workload = load(path, options)
    if kind == "native" and native.has_node_list(path):
        where = "the trace's own node list"
    else:
        where = choose_cluster(options, published).note
    return LoadedTrace(kind, workload, f"{describe_nodes(workload.nodes)} ({where})")


def load_trace(
    path: str | Path,
    *,
    kind: str = "auto",
    options: TraceOptions | None = None,
    nodes_path: str | Path | None = None,
) -> Workload:
    """:func:`open_trace`'s workload."""
    return open_trace(path, kind=kind, options=options, nodes_path=nodes_path).workload
