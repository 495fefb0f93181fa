"""``shaper-solver`` with shares moved across nodes (``--solver-moves-across``) and CPU-only
pods placed after their batch's plan (``--solver-cpu-only-last``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from sim.fgd import Cluster, Pod, TaskMix, run_inflation, through_solver
from sim.fgd.through_solver import SOLVER_POLICY, Applied, SolverCluster, run_through_solver
from solver.plan import Action, ActionKind, Plan
from solver.validate import validate
from tests.sim.test_inflation import NODES, PODS, check_cluster


def test_every_plan_of_the_trace_excerpt_is_valid_with_moves_across(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    across: list[Action] = []

    class Checked(SolverCluster):
        """Every plan validated against its instance before it is applied."""

        def apply(self, plan: Plan, batch: Sequence[tuple[str, Pod]]) -> Applied:
            instance = self.last_instance
            assert instance is not None
            assert validate(instance, plan) == []
            across.extend(
                a
                for a in plan.actions
                if a.kind is ActionKind.migrate
                and a.from_placement != a.to_placement
                and instance.job_by_id[a.job_id].is_fractional
            )
            applied = super().apply(plan, batch)
            check_cluster(self.cluster)
            return applied

    monkeypatch.setattr(through_solver, "SolverCluster", Checked)
    result = run_inflation(NODES, PODS, SOLVER_POLICY, seed=2, solver_moves_across=True)
    assert result.migrations >= len(across) > 0
    for move in across:
        assert " -> GPU " in move.reason.message


def test_moves_and_cpu_only_last_conserve_the_cluster() -> None:
    result = run_inflation(
        NODES,
        PODS,
        SOLVER_POLICY,
        seed=2,
        solver_moves_across=True,
        solver_cpu_only_last=True,
    )
    assert result.cluster is not None
    check_cluster(result.cluster)
    hosted = sum(len(h) for h in result.cluster.hosted)
    assert hosted + result.pods_failed == result.pods_arrived
    assert result.migrations > 0


def test_cpu_only_pods_last_leave_the_batch_its_cpu(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,1,V100\n")
    cpu_pod = Pod(cpu=10_000, mem=1024, gpus=0, milli=0, models=(), checkpointable=False)
    gpu_pod = Pod(cpu=12_000, mem=1024, gpus=1, milli=1000, models=(), checkpointable=False)
    workload = [cpu_pod, gpu_pod]
    mix = TaskMix(workload)

    def allocated(cpu_only_last: bool) -> tuple[int, int]:
        cluster = Cluster(nodes)
        _, allocations, failed, _ = run_through_solver(
            cluster,
            workload,
            mix,
            np.random.default_rng(0),
            budget=4,
            batch=1,
            cpu_only_last=cpu_only_last,
        )
        check_cluster(cluster)
        return int(allocations[-1]), failed

    assert allocated(False) == (0, 1)  # the CPU-only pod, first, took the CPU
    assert allocated(True) == (1000, 1)  # the GPU pod went first; the CPU-only one failed
