"""``shaper-solver``: the inflation experiment through ``solver.solve`` (fractional GPUs),
on the excerpts of the Alibaba 2023 trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.fgd import ALL_POLICIES, Cluster, TaskMix, read_pods, run_inflation
from sim.fgd.through_solver import SOLVER_POLICY, SolverCluster
from solver.plan import ActionKind
from solver.validate import validate
from tests.sim.test_inflation import NODES, PODS, check_cluster


def test_shaper_solver_conserves_capacity_and_is_deterministic() -> None:
    result = run_inflation(NODES, PODS, SOLVER_POLICY, seed=3, solver_batch=20)
    assert result.cluster is not None
    check_cluster(result.cluster)
    capacity = int(result.cluster.gpu_count.sum())
    assert 1.3 * capacity - 8 <= result.arrived_gpus <= 1.3 * capacity + 8
    assert result.allocated_gpus + result.unallocated_gpus == pytest.approx(capacity)
    assert result.pods_failed > 0
    # Every pod is placed or failed: the cluster hosts the rest.
    hosted = sum(len(h) for h in result.cluster.hosted)
    assert hosted + result.pods_failed == result.pods_arrived
    again = run_inflation(NODES, PODS, SOLVER_POLICY, seed=3, solver_batch=20)
    assert again.to_json() == result.to_json()


def test_shaper_solver_is_not_a_default_policy() -> None:
    assert SOLVER_POLICY not in ALL_POLICIES


def test_every_plan_is_valid_and_names_the_shared_gpu() -> None:
    cluster = Cluster(NODES, include_cpu_nodes=False)
    pods = read_pods(PODS)
    solver_cluster = SolverCluster(cluster, TaskMix(pods), movable_budget=8)
    gpu_pods = [p for p in pods if p.gpus > 0]
    rng = np.random.default_rng(0)
    order = [gpu_pods[i] for i in rng.permutation(len(gpu_pods))]
    shared_starts = 0
    for start in range(0, len(order), 25):
        batch = [(f"pod-{start + i}", pod) for i, pod in enumerate(order[start : start + 25])]
        plan = solver_cluster.plan(batch)
        instance = solver_cluster.last_instance
        assert instance is not None
        assert validate(instance, plan) == []
        for action in plan.actions:
            job = instance.job_by_id[action.job_id]
            if job.is_fractional and action.kind is ActionKind.start:
                ((node, indices),) = plan.gpu_indices[job.id].items()
                assert len(indices) == 1
                assert f"GPU {indices[0]} on {node}" in action.reason.message
                shared_starts += 1
        solver_cluster.apply(plan, batch)
        check_cluster(cluster)
    assert shared_starts > 0


def test_cli_runs_shaper_solver(tmp_path: Path) -> None:
    out = tmp_path / "inflation.json"
    result = CliRunner().invoke(
        sim_app,
        [
            "inflation",
            str(PODS),
            "--nodes",
            str(NODES),
            "--policies",
            "fgd,shaper-solver",
            "--solver-batch",
            "40",
            "--max-pods",
            "300",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["fgd", "shaper-solver"]
    bad = CliRunner().invoke(
        sim_app, ["inflation", str(PODS), "--nodes", str(NODES), "--solver-batch", "0"]
    )
    assert bad.exit_code != 0 and "--solver-batch" in bad.output
