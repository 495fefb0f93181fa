"""The FGD workload-inflation experiment on excerpts of the Alibaba 2023 trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.inflation import ALL_POLICIES, FULL, Cluster, TaskMix, read_pods, run_inflation

DATA = Path(__file__).parent / "data"
NODES = DATA / "alibaba-nodes-sample.csv"
PODS = DATA / "alibaba-pods-sample.csv"


def check_cluster(cluster: Cluster) -> None:
    """Nothing over-committed, and the free capacity is exactly capacity − placed pods."""
    assert (cluster.cpu >= 0).all() and (cluster.mem >= 0).all()
    real = cluster.gpu[cluster.gpu >= 0]
    assert (real <= FULL).all()
    cpu = cluster.cpu_cap.copy()
    mem = cluster.mem_cap.copy()
    gpu = np.where(cluster.gpu >= 0, FULL, -1)
    for node, hosted in enumerate(cluster.hosted):
        for pod, gpus in hosted:
            cpu[node] -= pod.cpu
            mem[node] -= pod.mem
            assert len(gpus) == pod.gpus
            for g in gpus:
                gpu[node, g] -= pod.milli if pod.shares else FULL
            if pod.models:
                assert cluster.models[node] in pod.models
    assert (cpu == cluster.cpu).all() and (mem == cluster.mem).all()
    assert (gpu == cluster.gpu).all()


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_inflation_conserves_capacity(policy: str) -> None:
    result = run_inflation(NODES, PODS, policy, seed=3)
    assert result.cluster is not None
    check_cluster(result.cluster)
    capacity = int(result.cluster.gpu_count.sum())
    assert result.capacity_gpus == capacity
    assert result.arrived_gpus >= 1.3 * capacity
    assert result.allocated_gpus + result.unallocated_gpus == pytest.approx(capacity)
    # More was asked than fits: some pods must have failed.
    assert result.pods_failed > 0
    assert 0 <= result.fragmented_share <= 1


def test_same_seed_same_result() -> None:
    a = run_inflation(NODES, PODS, "random", seed=9).to_json()
    b = run_inflation(NODES, PODS, "random", seed=9).to_json()
    c = run_inflation(NODES, PODS, "random", seed=10).to_json()
    assert a == b and a != c


def test_fragmentation_measure_by_hand() -> None:
    pods = read_pods(PODS)
    mix = TaskMix(pods)
    # Two kinds only, to check the measure: a half-GPU pod and an 8-GPU pod, equally popular.
    mix.kinds = [(1, 500, 0.5), (8, FULL, 0.5)]
    gpu = np.array([[FULL, FULL, 300, 0, -1, -1, -1, -1]])
    # half-GPU kind: fits (a full GPU), the 300 left on GPU 2 is too small -> 300 fragmented;
    # 8-GPU kind: does not fit -> all 2,300 free milli are fragmented.
    assert mix.node_fragmentation(gpu)[0] == pytest.approx(0.5 * 300 + 0.5 * 2300)
    # With CPU counted: a node without the half-GPU kind's CPU cannot host it at all.
    mix.needs = {(1, 500): (4000.0, 0.0), (8, FULL): (0.0, 0.0)}
    cpu, mem = np.array([2000]), np.array([10**6])
    assert mix.node_fragmentation(gpu, cpu, mem)[0] == pytest.approx(2300)


def test_cli_inflation(tmp_path: Path) -> None:
    out = tmp_path / "inflation.json"
    result = CliRunner().invoke(
        sim_app,
        [
            "inflation",
            str(PODS),
            "--nodes",
            str(NODES),
            "--policies",
            "best-fit,shaper-defrag",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["best-fit", "shaper-defrag"]
