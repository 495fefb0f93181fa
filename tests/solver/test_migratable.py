"""``Job.migratable``: a job whose scheduler cannot be told where it goes (Kueue, Ray) is
never moved to another node of its own cluster, whatever ``SolverConfig.migration`` says
— by the greedy's defragmentation, a service's growth, the fractional repack, the CP-SAT
model's evacuations or the exact model — and ``validate`` calls such a move a violation.
It may still be stopped, and moved to another cluster where cross-cluster migration
allows (a federation group with a Kueue member is solved once with migrations on).

Each case is run both ways: migratable, the same instance migrates (so the case would
catch a pass that ignored the flag)."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from solver.exact import solve_exact
from solver.federation import cross_cluster_moves, federate
from solver.greedy import GreedyEngine
from solver.instance import GpuModel, Instance, Job, MigrationCostModel, Node, SolverConfig
from solver.model import PlacementModel, build_classes, build_pools
from solver.model_inputs import evacuations
from solver.plan import ActionKind, Plan
from solver.solve import GREEDY, solve
from solver.validate import validate

from .builders import FAST, instance, job, node, plan_from, plan_with, running, service

GREEDY_ONLY = FAST.model_copy(update={"use_cp_sat": False})


def _fragmented(migratable: bool, config: SolverConfig = FAST) -> Instance:
    """Half of each of two nodes held by a checkpointable job; an 8-GPU job waits: it
    starts only once one of them moves to the other node."""
    jobs = [
        running("r0", {"n0": 4}, checkpointable=True, migratable=migratable),
        running("r1", {"n1": 4}, checkpointable=True, migratable=migratable),
        job("g", 8),
    ]
    return instance([node("n0"), node("n1")], jobs, config=config)


def _migrations(plan: Plan) -> list[str]:
    return [a.job_id for a in plan.actions if a.kind is ActionKind.migrate]


@pytest.mark.parametrize("config", [GREEDY_ONLY, FAST], ids=["greedy", "greedy+cp-sat"])
def test_defragmentation_moves_only_migratable_jobs(config: SolverConfig) -> None:
    moved = plan_with("shaper", _fragmented(True, config))
    assert len(_migrations(moved)) == 1
    assert "g" in moved.placement
    kept = plan_with("shaper", _fragmented(False, config))
    assert _migrations(kept) == []
    assert kept.placement["r0"] == {"n0": 4} and kept.placement["r1"] == {"n1": 4}
    assert "g" in kept.pending


def test_cp_sat_evacuates_no_node_of_a_job_that_is_not_migratable() -> None:
    for migratable, kinds in ((True, [2]), (False, [])):
        inst = _fragmented(migratable)
        engine = GreedyEngine(inst, GREEDY)
        pools = build_pools(engine.state)
        found = evacuations(engine, pools, budget=1)
        assert [len(kind.nodes) for kind in found] == kinds
        # Built and solved, the model places the gang only by an evacuation.
        classes = build_classes(inst, engine.compat, [inst.job_by_id["g"]], {"g": ()})
        model = PlacementModel(inst, pools, classes, [], {}, evacuations=found, migration_budget=1)
        model.build()
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        assert solver.solve(model.model) == cp_model.OPTIMAL
        assert sum(solver.value(o.var) for o in model.options) == (1 if migratable else 0)


def test_a_service_short_of_demand_moves_only_a_migratable_job() -> None:
    # The service runs on A100 only; the block job may move to the free H100 node, and
    # may not be stopped.
    def plan(migratable: bool) -> Plan:
        jobs = [
            service(
                "s", (6, 6, 6), {"a": 2}, min_replicas=1, allowed_gpu_models=frozenset({"a100"})
            ),
            running("b", {"a": 6}, checkpointable=True, preemptible=False, migratable=migratable),
        ]
        return plan_with("shaper", instance([node("a"), node("h", model="h100")], jobs))

    moved = plan(True)
    assert moved.placement["b"] == {"h": 6} and moved.placement["s"] == {"a": 6}
    kept = plan(False)
    assert kept.placement["b"] == {"a": 6} and kept.placement["s"] == {"a": 2}
    assert _migrations(kept) == []


A100 = GpuModel(name="a100", memory_mib=80_000)


def _shares(migratable: bool) -> Instance:
    # GPU 0 holds 600, GPU 1 a checkpointable 300: a pending 800 fits only once the 300
    # moves to GPU 0 (another GPU of the same node: a migration all the same).
    def share(job_id: str, milli: int, gpu: int | None = None, **kw: object) -> Job:
        if gpu is None:
            return Job(id=job_id, gpu_milli=milli, **kw)
        return Job(
            id=job_id,
            gpu_milli=milli,
            placement={"n0": 1},
            gpu_indices={"n0": (gpu,)},
            start_time=0.0,
            **kw,
        )

    return Instance(
        gpu_models=(A100,),
        nodes=(Node(name="n0", cluster="c", gpu_model="a100", gpus=2, cpu_milli=64_000),),
        jobs=(
            share("a", 600, 0),
            share("b", 300, 1, checkpointable=True, migratable=migratable),
            share("c", 800),
        ),
        config=SolverConfig(use_cp_sat=False),
    )


def test_the_fractional_repack_moves_only_migratable_shares() -> None:
    moved = solve(_shares(True))
    assert validate(_shares(True), moved) == []
    assert _migrations(moved) == ["b"] and moved.gpu_indices["c"] == {"n0": (1,)}
    inst = _shares(False)
    kept = solve(inst)
    assert validate(inst, kept) == []
    assert _migrations(kept) == [] and "c" in kept.pending


def test_the_exact_model_moves_only_migratable_jobs() -> None:
    for migratable in (True, False):
        inst = _fragmented(migratable)
        result = solve_exact(inst, time_limit_s=10.0, num_workers=1)
        assert result.exact and result.plan is not None, result.violations
        assert len(_migrations(result.plan)) == (1 if migratable else 0)


# A federation group planned once (app.federation.planning, for its members): migrations
# within a cluster on, and to another cluster.
GROUP = SolverConfig(replica_moves=False, cross_cluster_migration=True, deterministic=True)
H100 = GpuModel(name="H100", memory_mib=81920)


def _group(migratable: bool) -> Instance:
    """East: two 8-GPU nodes, each half held by a small checkpointable job, and an 8-GPU
    job waiting there (held there); west: one idle node. Moving a small job to the other
    east node is cheaper than moving it to west."""

    def small(job_id: str, where: str) -> Job:
        return Job(
            id=job_id,
            replicas=4,
            placement={where: 4},
            checkpointable=True,
            checkpoint_size_mib=10_240,
            start_time=-3600.0,
            expected_runtime_s=36_000.0,
            migratable=migratable,
        )

    east = Instance(
        gpu_models=(H100,),
        nodes=tuple(
            Node(name=f"east/e{i}", cluster="east", gpu_model="H100", gpus=8) for i in range(2)
        ),
        jobs=(
            small("east/s0", "east/e0"),
            small("east/s1", "east/e1"),
            Job(id="east/gang", replicas=8, max_nodes=1, submit_time=-3600.0),
        ),
        config=GROUP,
    )
    west = Instance(
        gpu_models=(H100,),
        nodes=(Node(name="west/w0", cluster="west", gpu_model="H100", gpus=8),),
        config=GROUP,
    )
    return federate(
        {"east": east, "west": west},
        movable={},
        running_movable={j: frozenset({"west"}) for j in ("east/s0", "east/s1")},
        migration=MigrationCostModel(inter_cluster_bandwidth_mib_per_s=1000),
        config=GROUP,
    )


def test_a_job_that_is_not_migratable_may_still_move_to_another_cluster() -> None:
    within = _group(True)
    plan = plan_with("shaper", within)
    (moved,) = _migrations(plan)
    assert next(iter(plan.placement[moved])).startswith("east/")  # the cheaper move
    assert cross_cluster_moves(within, plan) == []
    assert plan.placement["east/gang"]
    across = _group(False)
    plan = plan_with("shaper", across)
    (move,) = cross_cluster_moves(across, plan)
    assert move.target == "west" and _migrations(plan) == [move.job_id]
    assert plan.placement["east/gang"]


def test_validate_names_a_job_moved_within_its_cluster_that_is_not_migratable() -> None:
    inst = _fragmented(False)
    plan = plan_from(inst, {"r0": {"n1": 4}, "r1": {"n1": 4}, "g": {"n0": 8}})
    (violation,) = validate(inst, plan)
    assert (violation.rule, violation.job_id) == ("movement", "r0")
    assert "not migratable" in violation.message
    # Migratable, the same plan is legal.
    legal = _fragmented(True)
    assert (
        validate(legal, plan_from(legal, {"r0": {"n1": 4}, "r1": {"n1": 4}, "g": {"n0": 8}})) == []
    )
    # To another cluster its ``clusters`` lists, it is legal too.
    group = _group(False)
    target = {
        "east/s0": {"west/w0": 4},
        "east/s1": {"east/e1": 4},
        "east/gang": {"east/e0": 8},
    }
    assert validate(group, plan_from(group, target)) == []


def test_validate_calls_a_share_moved_to_another_gpu_of_its_node_a_violation() -> None:
    inst = _shares(False)
    plan = solve(_shares(True))  # moves b from GPU 1 to GPU 0
    violations = validate(inst, plan)
    assert [(v.rule, v.job_id) for v in violations] == [("movement", "b")]
