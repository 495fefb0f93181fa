"""connectors.ray.translate on answers of the shape Ray 2.60's REST APIs give (as read from
the test cluster), for the cases the live cluster does not reach on its own: fractions of
GPUs that round past a node's count, a node restarted under its old name."""

from __future__ import annotations

from typing import Any

from connectors.ray.config import RayConnectorConfig
from connectors.ray.translate import fit_to_nodes, gpu_use, node_reports
from wire.telemetry import AllocationReport, JobReport, JobState, NodeState

CONFIG = RayConnectorConfig(cluster="ray-lab")


def node(node_id: str, name: str, state: str, gpus: float) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "state": state,
        "node_name": "192.0.2.2",  # Ray's node name is the host's IP, shared by its raylets
        "resources_total": {"GPU": gpus, "CPU": 2.0, "memory": 2**34, "accelerator_type:L4": 1},
        "labels": {"ray.io/node-id": node_id, "shaper.io/node": name},
    }


def test_a_node_restarted_under_its_name_is_the_live_one() -> None:
    nodes = node_reports(
        [node("aa", "w1", "DEAD", 4), node("bb", "w1", "ALIVE", 4), node("cc", "w2", "DEAD", 4)],
        CONFIG,
        draining=frozenset({"bb"}),
    )
    assert [(n.node_id, n.report.name, n.report.state) for n in nodes] == [
        ("bb", "w1", NodeState.draining),
        ("cc", "w2", NodeState.down),
    ]
    assert nodes[0].report.gpu_model == "L4" and nodes[0].report.memory_mib == 16384


def test_fractional_gpus_never_count_past_a_node() -> None:
    actors = [
        {"job_id": f"0{i}000000", "node_id": "aa", "required_resources": {"GPU": 0.5}}
        for i in range(4)
    ]
    use = gpu_use([], actors, [], {"aa": "w1"}, "GPU")
    assert {job_id: dict(u.held) for job_id, u in use.items()} == {
        f"0{i}000000": {"w1": 0.5} for i in range(4)
    }
    # Each job holds half a GPU, which Shaper counts as one: four on a two-GPU node.
    jobs = [
        JobReport(
            external_id=f"j{i}",
            state=JobState.running,
            gpus_requested=1,
            allocations=[AllocationReport(node="w1", gpu_count=1)],
        )
        for i in range(4)
    ]
    fitted = fit_to_nodes(jobs, {"w1": 2})
    assert [sum(a.gpus for a in j.allocations) for j in fitted] == [1, 1, 0, 0]
    assert [j.gpus_requested for j in fitted] == [1, 1, 1, 1]
