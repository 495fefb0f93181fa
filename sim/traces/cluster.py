"""The cluster a trace without a node list replays on, and where its size comes from.

Philly, Pollux, Gavel and Shaper's CSV list jobs, not nodes. Each of their loaders names
the setup its source published (:class:`PublishedCluster`), and the replay uses it unless
``TraceOptions.gpus`` / ``gpus_per_node`` (the CLI's ``--gpus`` / ``--gpus-per-node``) say
otherwise. The two values are taken separately: ``--gpus-per-node 8`` alone keeps the
published GPU count and regroups it in nodes of 8.

:func:`choose_cluster` returns the two numbers with a note saying where each came from,
and :func:`describe_nodes` what the resulting nodes are; ``shaper sim replay`` prints both,
so that a result is never read against a cluster other than the one it ran on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sim.traces.common import TraceError, TraceInput, TraceOptions
from sim.workload import Node

# Past this many kinds of node (an Alibaba node list has a dozen), the description is cut.
MAX_NODE_KINDS = 4


@dataclass(frozen=True, slots=True)
class PublishedCluster:
    """The cluster a trace's source replayed it on; ``source`` says who published it."""

    gpus: int
    gpus_per_node: int
    source: str


@dataclass(frozen=True, slots=True)
class ClusterChoice:
    gpus: int
    gpus_per_node: int
    note: str


def choose_cluster(options: TraceOptions, published: PublishedCluster) -> ClusterChoice:
    """The options' values where given, the published ones elsewhere, and which is which."""
    for flag, value in (("--gpus", options.gpus), ("--gpus-per-node", options.gpus_per_node)):
        if value is not None and value < 1:
            raise TraceError(f"{flag} must be at least 1, not {value}", about=TraceInput.cluster)
    gpus = published.gpus if options.gpus is None else options.gpus
    per_node = published.gpus_per_node if options.gpus_per_node is None else options.gpus_per_node
    if options.gpus is None and options.gpus_per_node is None:
        note = f"{published.source}, the loader's default; --gpus/--gpus-per-node to change"
    elif options.gpus is not None and options.gpus_per_node is not None:
        note = (
            f"--gpus {gpus} --gpus-per-node {per_node}; the loader's default is "
            f"{published.gpus} GPUs in nodes of {published.gpus_per_node}, {published.source}"
        )
    elif options.gpus is not None:
        note = (
            f"--gpus {gpus}; {per_node} per node as {published.source}, --gpus-per-node to change"
        )
    else:
        note = f"--gpus-per-node {per_node}; {gpus} GPUs as {published.source}, --gpus to change"
    return ClusterChoice(gpus=gpus, gpus_per_node=per_node, note=note)


def describe_nodes(nodes: Sequence[Node]) -> str:
    """E.g. ``16 nodes × 4 V100 GPUs`` or ``36 nodes × 1 V100 + 36 nodes × 1 K80 (72 GPUs)``."""
    kinds = Counter((node.gpu_model, node.gpus) for node in nodes)
    total = sum(node.gpus for node in nodes)

    def count(number: int) -> str:
        return f"{number:,} node" if number == 1 else f"{number:,} nodes"

    models = {model for model, _ in kinds}
    if len(models) == 1:
        (model,) = models
        parts = [f"{count(n)} × {gpus}" for (_, gpus), n in kinds.items()]
        text = " + ".join(parts) + f" {model} GPUs"
        return text if len(parts) == 1 else f"{text} ({total:,} GPUs)"
    parts = [f"{count(n)} × {gpus} {model}" for (model, gpus), n in kinds.items()]
    if len(parts) > MAX_NODE_KINDS:
        parts = [*parts[:MAX_NODE_KINDS], f"{len(parts) - MAX_NODE_KINDS} more kinds"]
    return " + ".join(parts) + f" ({total:,} GPUs in {len(nodes):,} nodes)"
