"""``shaper-solver`` with shares moved across nodes (``--solver-moves-across``) and CPU-only
pods' turn (``--solver-cpu-only arrival | in-order | last``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from sim.fgd import Cluster, Pod, TaskMix, read_pods, run_inflation, through_solver
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
    # Seed 2 with the CPU-only pods on arrival is a run with shares moved across nodes.
    result = run_inflation(
        NODES, PODS, SOLVER_POLICY, seed=2, solver_moves_across=True, solver_cpu_only="arrival"
    )
    assert result.migrations >= len(across) > 0
    for move in across:
        assert " -> GPU " in move.reason.message


@pytest.mark.parametrize(("turn", "seed"), [("last", 2), ("in-order", 3)])
def test_moves_and_the_cpu_only_pods_turn_conserve_the_cluster(turn: str, seed: int) -> None:
    result = run_inflation(
        NODES,
        PODS,
        SOLVER_POLICY,
        seed=seed,
        solver_moves_across=True,
        solver_cpu_only=turn,
    )
    assert result.cluster is not None
    check_cluster(result.cluster)
    hosted = sum(len(h) for h in result.cluster.hosted)
    assert hosted + result.pods_failed == result.pods_arrived
    assert result.migrations > 0


def test_the_cpu_only_pods_turn(tmp_path: Path) -> None:
    """One node's CPU fits one of a CPU-only pod and a GPU pod; who gets it depends on the
    turn: ``arrival`` places the CPU-only pod as it comes, ahead of a GPU pod that came
    before it but waits for its batch's solve; ``in-order`` places every pod in arrival
    order; ``last`` places the CPU-only pods after their batch's plan."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,1,V100\n")
    cpu_pod = Pod(cpu=10_000, mem=1024, gpus=0, milli=0, models=(), checkpointable=False)
    gpu_pod = Pod(cpu=12_000, mem=1024, gpus=1, milli=1000, models=(), checkpointable=False)

    def allocated(workload: list[Pod], turn: str) -> tuple[int, int]:
        cluster = Cluster(nodes)
        _, allocations, failed, _ = run_through_solver(
            cluster,
            workload,
            TaskMix(workload),
            np.random.default_rng(0),
            budget=4,
            batch=50,
            cpu_only=turn,
        )
        check_cluster(cluster)
        return int(allocations[-1]), failed

    gpu_first, cpu_first = [gpu_pod, cpu_pod], [cpu_pod, gpu_pod]
    assert allocated(gpu_first, "arrival") == (0, 1)  # the CPU-only pod jumped the batch
    assert allocated(gpu_first, "in-order") == (1000, 1)
    assert allocated(gpu_first, "last") == (1000, 1)
    assert allocated(cpu_first, "arrival") == (0, 1)
    assert allocated(cpu_first, "in-order") == (0, 1)  # first come, first placed
    assert allocated(cpu_first, "last") == (1000, 1)
    with pytest.raises(ValueError, match="cpu_only must be one of"):
        allocated(cpu_first, "first")


def test_counting_memory_gives_the_typical_shapes_their_pods_least_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instances = []

    class Recorded(SolverCluster):
        def apply(self, plan: Plan, batch: Sequence[tuple[str, Pod]]) -> Applied:
            instance = self.last_instance
            assert instance is not None
            assert validate(instance, plan) == []
            instances.append(instance)
            return super().apply(plan, batch)

    monkeypatch.setattr(through_solver, "SolverCluster", Recorded)
    blind = run_inflation(NODES, PODS, SOLVER_POLICY, seed=1, solver_moves_across=True)
    assert all(s.memory_mib == 0 for s in instances[-1].typical_shapes)
    aware = run_inflation(
        NODES, PODS, SOLVER_POLICY, seed=1, solver_moves_across=True, solver_memory=True
    )
    least = TaskMix(read_pods(PODS)).least_memory
    shapes = instances[-1].typical_shapes
    assert any(s.memory_mib > 0 for s in shapes)
    for s in shapes:
        models = tuple(sorted(s.gpu_models or ()))
        assert s.memory_mib == least[(s.cpu_milli, s.gpu_milli, s.gpus, models)]
    assert aware.cluster is not None
    check_cluster(aware.cluster)
    hosted = sum(len(h) for h in aware.cluster.hosted)
    assert hosted + aware.pods_failed == aware.pods_arrived
    # The measure changed where pods went on this seed (the README's excerpt figures).
    assert aware.curve != blind.curve
