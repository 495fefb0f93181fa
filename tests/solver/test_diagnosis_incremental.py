"""The classifier's shortcuts against the long way: a gang's room counted per shape of
node (model, open GPUs) as node by node, and a cluster settled once (its nodes and
allocations) classified with other queues as from scratch."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from solver.diagnosis import NodeAt, QueuedJobAt, classify, settle
from solver.diagnosis.classify import _QueueView
from solver.diagnosis.state import ClusterAt
from tests.solver.test_diagnosis import random_cluster

MODELS = ("H100", "A100", "L4")


def _node_by_node(job: QueuedJobAt, open_nodes: list[tuple[NodeAt, int]]) -> bool:
    """Members per accepted node, the nodes that hold the most first, on at most
    ``max_nodes`` of them."""
    slots = sorted(
        (gpus // job.gpus_per_member for node, gpus in open_nodes if job.accepts(node.gpu_model)),
        reverse=True,
    )
    if job.max_nodes is not None:
        slots = slots[: job.max_nodes]
    return sum(slots) >= job.members


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_gang_completes_as_counted_node_by_node(seed: int) -> None:
    rng = random.Random(seed)
    open_nodes = [
        (NodeAt(f"n{i}", rng.choice(MODELS), 8), rng.randint(1, 8))
        for i in range(rng.randint(0, 12))
    ]
    queue = []
    for _ in range(rng.randint(1, 8)):
        members = rng.choice((1, 2, 3, 4, 8, 12))
        queue.append(
            QueuedJobAt(
                team="a",
                gpus=members * rng.choice((1, 2, 4, 8)),
                gpu_models=frozenset(rng.sample(MODELS, rng.randint(0, 2))),
                members=members,
                max_nodes=rng.choice((None, 1, 2, 3, 5)),
            )
        )
    cluster = ClusterAt(nodes=tuple(node for node, _ in open_nodes), queue=tuple(queue))
    view = _QueueView(cluster, Counter(), tuple(open_nodes))
    for job in queue:
        assert view._can_complete(job) == _node_by_node(job, open_nodes)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=0, max_value=2**32))
def test_a_settled_cluster_classifies_another_queue_as_from_scratch(seed: int, other: int) -> None:
    cluster = random_cluster(seed)
    settled = settle(cluster)
    elsewhere = random_cluster(other)
    queued = replace(cluster, queue=elsewhere.queue, quota_caps=elsewhere.quota_caps)
    assert classify(queued, settled) == classify(queued)
    assert classify(cluster, settled) == classify(cluster)
