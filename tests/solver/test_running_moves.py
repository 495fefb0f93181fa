"""A federation group's plan moving a running job to another cluster (issue 16).

East has one 8-GPU node; a small running checkpointable job holds 2 of its GPUs, so an
8-GPU gang queued at east (held there: it may not leave) waits. West is idle. Planned as
one group, the small job moves to west (checkpoint, transfer over the link, resubmit on one
node there) and the gang starts at east — when that move could be carried out
(``solver.federation.federate``'s ``running_movable``) and pays for its transfer.
"""

from __future__ import annotations

import pytest

from solver import Instance, SolverConfig
from solver.federation import cross_cluster_moves, federate
from solver.instance import GpuModel, Job, JobShape, MigrationCostModel, Node, SlaPolicy
from solver.objective import evaluate
from solver.plan import Plan
from solver.policies import get_policy
from solver.validate import validate
from tests.solver.builders import plan_from

HOUR = 3600.0
H100 = GpuModel(name="H100", memory_mib=81920)
# The group plan's settings (app.federation.planning): no migration within a cluster
# (each member's own cycle does those), moves across clusters only.
GROUP = SolverConfig(
    migration=False,
    cp_sat_migration=False,
    replica_moves=False,
    cross_cluster_migration=True,
    deterministic=True,
)
FAST_LINK = MigrationCostModel(inter_cluster_bandwidth_mib_per_s=1000)


def _small(**changes: object) -> Job:
    fields: dict[str, object] = {
        "id": "east/small",
        "replicas": 2,
        "placement": {"east/e0": 2},
        "checkpointable": True,
        "checkpoint_size_mib": 10_240,
        "start_time": -HOUR,
        "expected_runtime_s": 10 * HOUR,
    }
    fields.update(changes)
    return Job.model_validate(fields)


def _parts(small: Job, *, east_nodes: int = 1) -> dict[str, Instance]:
    gang = Job(id="east/gang", replicas=8, max_nodes=1, submit_time=-HOUR, priority=1.0)
    east = Instance(
        gpu_models=(H100,),
        nodes=tuple(
            Node(name=f"east/e{i}", cluster="east", gpu_model="H100", gpus=8)
            for i in range(east_nodes)
        ),
        jobs=(small, gang),
        config=GROUP,
    )
    west = Instance(
        gpu_models=(H100,),
        nodes=(Node(name="west/w0", cluster="west", gpu_model="H100", gpus=8),),
        config=GROUP,
    )
    return {"east": east, "west": west}


def _plan(
    small: Job,
    *,
    running_movable: dict[str, frozenset[str]] | None = None,
    link: MigrationCostModel = FAST_LINK,
    config: SolverConfig = GROUP,
) -> tuple[Instance, Plan]:
    whole = federate(
        _parts(small),
        movable={},
        running_movable={"east/small": frozenset({"west"})}
        if running_movable is None
        else running_movable,
        migration=link,
        config=config,
    )
    plan = get_policy("shaper").plan(whole)
    assert validate(whole, plan) == [], validate(whole, plan)
    return whole, plan


def test_the_small_job_moves_to_the_idle_cluster_and_the_gang_starts_at_home() -> None:
    whole, plan = _plan(_small())
    assert whole.job_by_id["east/small"].clusters == frozenset({"east", "west"})
    assert whole.job_by_id["east/gang"].clusters == frozenset({"east"})  # held at home
    assert plan.placement["east/small"] == {"west/w0": 2}  # one node
    assert plan.placement["east/gang"] == {"east/e0": 8}
    (move,) = cross_cluster_moves(whole, plan)
    assert (move.job_id, move.home, move.target, move.source) == (
        "east/small",
        "east",
        "west",
        "east/e0",
    )
    assert move.placement == {"west/w0": 2}
    # Priced as a move across: checkpoint and restore plus the transfer over the link.
    terms = evaluate(whole, plan.placement)
    small = whole.job_by_id["east/small"]
    seconds = whole.migration.migration_seconds(small, across=True)
    assert seconds > whole.migration.migration_seconds(small)
    assert terms.migration == pytest.approx(2 * seconds / whole.config.value_horizon_s)


@pytest.mark.parametrize(
    ("why", "small", "running_movable", "link"),
    [
        (
            # Within a cluster the same move would cost 50 s of 2 GPUs: priced across, its
            # 20,000 s transfer costs more than the gang's hour of 8 GPUs gains.
            "the link is too slow: its transfer costs more than the gang gains",
            _small(),
            None,
            MigrationCostModel(inter_cluster_bandwidth_mib_per_s=0.5),
        ),
        (
            # A fast link, but the sites bill what leaves: 10 GiB at 4,096 GPU-seconds a GiB
            # shared over its 2 GPUs is the slow link's 20,480 s of each, as costly.
            "egress: the image's price over the link costs more than the gang gains",
            _small(),
            None,
            FAST_LINK.model_copy(update={"inter_cluster_egress_gpu_s_per_gib": 4096.0}),
        ),
        # The app lists only jobs it could move (checkpointable, a spec the target runs,
        # a target that pins jobs): a job it does not list stays home.
        ("not listed: no spec, a target that cannot pin, ...", _small(), {}, FAST_LINK),
        (
            "frozen: Shaper acted on it within the dwell time",
            _small(last_acted_at=-60.0),
            None,
            FAST_LINK,
        ),
        (
            "moved within the migration cooldown",
            _small(last_moved_at=-60.0),
            None,
            FAST_LINK,
        ),
    ],
)
def test_it_stays_home_when_the_move_does_not_pay_or_may_not_be_made(
    why: str,
    small: Job,
    running_movable: dict[str, frozenset[str]] | None,
    link: MigrationCostModel,
) -> None:
    whole, plan = _plan(small, running_movable=running_movable, link=link)
    assert cross_cluster_moves(whole, plan) == [], why
    assert plan.placement["east/small"] == {"east/e0": 2}, why
    assert "east/gang" not in plan.placement, why


def test_the_budgets_hold_a_move_across_as_any_migration() -> None:
    no_budget = GROUP.model_copy(update={"max_migrations_per_cycle": 0})
    whole, plan = _plan(_small(), config=no_budget)
    assert cross_cluster_moves(whole, plan) == []
    # The team's migrations per day, spent.
    parts = _parts(_small(team="research", migrations_today=2))
    policy = SlaPolicy(team="research", max_migrations_per_day=2)
    parts = {n: p.model_copy(update={"policies": (policy,)}) for n, p in parts.items()}
    whole = federate(
        parts,
        movable={},
        running_movable={"east/small": frozenset({"west"})},
        migration=FAST_LINK,
        config=GROUP,
    )
    plan = get_policy("shaper").plan(whole)
    assert cross_cluster_moves(whole, plan) == []


def test_only_a_checkpointable_job_on_one_node_may_be_listed() -> None:
    for job in (
        _small(checkpointable=False),
        _small(replicas=2, gpus_per_replica=1, placement={"east/e0": 1, "east/e1": 1}),
    ):
        parts = _parts(job, east_nodes=len(job.placement))
        with pytest.raises(ValueError, match="only a checkpointable block job on one node"):
            federate(
                parts,
                movable={},
                running_movable={"east/small": frozenset({"west"})},
                migration=FAST_LINK,
                config=GROUP,
            )


def test_without_cross_cluster_migration_nothing_moves_across() -> None:
    # Each cluster's own settings (migration on, cross_cluster_migration off): a job whose
    # clusters list another one still moves only within its cluster.
    config = GROUP.model_copy(update={"migration": True, "cross_cluster_migration": False})
    whole, plan = _plan(_small(), config=config)
    assert cross_cluster_moves(whole, plan) == []


def test_a_move_across_is_valid_only_where_the_jobs_clusters_allow_it() -> None:
    whole = federate(
        _parts(_small()),
        movable={},
        running_movable={"east/small": frozenset({"west"})},
        migration=FAST_LINK,
        config=GROUP,
    )
    assert validate(whole, plan_from(whole, {"east/small": {"west/w0": 2}})) == []
    held = federate(_parts(_small()), movable={}, migration=FAST_LINK, config=GROUP)
    violations = [str(v) for v in validate(held, plan_from(held, {"east/small": {"west/w0": 2}}))]
    assert any("moved to another cluster, not in its clusters" in v for v in violations)


def test_a_move_across_goes_to_one_node() -> None:
    small = _small(replicas=2, gpus_per_replica=1)
    parts = _parts(small)
    nodes = (
        Node(name="west/w0", cluster="west", gpu_model="H100", gpus=8),
        Node(name="west/w1", cluster="west", gpu_model="H100", gpus=8),
    )
    parts["west"] = parts["west"].model_copy(update={"nodes": nodes})
    whole = federate(
        parts,
        movable={},
        running_movable={"east/small": frozenset({"west"})},
        migration=FAST_LINK,
        config=GROUP,
    )
    split = plan_from(whole, {"east/small": {"west/w0": 1, "west/w1": 1}})
    violations = [str(v) for v in validate(whole, split)]
    assert any("onto several nodes" in v for v in violations)
    plan = get_policy("shaper").plan(whole)
    (move,) = cross_cluster_moves(whole, plan)
    assert len(move.placement) == 1


def test_a_service_short_of_its_demand_makes_room_by_a_move_across_priced_as_one() -> None:
    small = _small(replicas=4, placement={"east/e0": 4})
    service = Job(
        id="east/svc",
        shape=JobShape.elastic,
        replicas=4,
        placement={"east/e0": 4},
        min_replicas=1,
        max_replicas=8,
        forecast=(8,),
    )
    parts = _parts(small)
    parts["east"] = parts["east"].model_copy(update={"jobs": (small, service)})
    whole = federate(
        parts,
        movable={},
        running_movable={"east/small": frozenset({"west"})},
        migration=FAST_LINK,
        config=GROUP,
    )
    plan = get_policy("shaper").plan(whole)
    assert validate(whole, plan) == []
    (move,) = cross_cluster_moves(whole, plan)
    assert move.placement == {"west/w0": 4}
    assert plan.placement["east/svc"] == {"east/e0": 8}
    # Too slow a link: the transfer costs more than the replicas gain; it stays.
    slow = whole.model_copy(
        update={"migration": MigrationCostModel(inter_cluster_bandwidth_mib_per_s=0.1)}
    )
    plan = get_policy("shaper").plan(slow)
    assert cross_cluster_moves(slow, plan) == []
    assert plan.placement["east/small"] == {"east/e0": 4}
