"""Which actions of a plan wait for which (solver.dependencies)."""

from __future__ import annotations

import pytest

from solver.dependencies import (
    action_graph,
    gpu_changes,
    split_replica_moves,
    unsplit_replica_moves,
)
from solver.instance import GpuModel, Instance, Job, JobShape, Node
from solver.plan import Action, ActionKind, Plan, Reason, ReasonCode

WHY = Reason(code=ReasonCode.placed, message="test")


def _instance(*jobs: Job, nodes: int = 3) -> Instance:
    return Instance(
        gpu_models=(GpuModel(name="H100", memory_mib=81920),),
        nodes=tuple(
            Node(name=f"n{i}", cluster="c", gpu_model="H100", gpus=8) for i in range(nodes)
        ),
        jobs=jobs,
    )


def _running(job_id: str, node: str, gpus: int) -> Job:
    return Job(id=job_id, replicas=1, gpus_per_replica=gpus, placement={node: gpus}, start_time=0)


def _pending(job_id: str, gpus: int) -> Job:
    return Job(id=job_id, replicas=1, gpus_per_replica=gpus)


def _action(kind: ActionKind, job: str, before: dict[str, int], after: dict[str, int]) -> Action:
    return Action(kind=kind, job_id=job, from_placement=before, to_placement=after, reason=WHY)


def test_gpu_changes_are_per_node_differences() -> None:
    assert gpu_changes({"a": 4}, {"b": 4}) == {"a": -4, "b": 4}
    assert gpu_changes({"a": 4}, {"a": 2}) == {"a": -2}
    assert gpu_changes({"a": 4}, {"a": 4}) == {}


def test_a_start_waits_for_the_move_that_frees_its_gpus_and_free_gpus_go_first() -> None:
    instance = _instance(
        _running("half-0", "n0", 4),
        _running("half-1", "n1", 4),
        _pending("big", 8),
        _pending("small", 4),
    )
    plan = Plan(
        policy="test",
        actions=[
            _action(ActionKind.migrate, "half-0", {"n0": 4}, {"n1": 4}),
            _action(ActionKind.start, "big", {}, {"n0": 8}),
            _action(ActionKind.start, "small", {}, {"n2": 4}),
        ],
    )
    graph = action_graph(instance, plan)
    # The move takes n1's 4 free GPUs: nothing to wait for. The big start needs n0's 4
    # free GPUs and the 4 the move frees; the small start lands on an empty node.
    assert graph.depends_on == ((), (0,), ())
    assert graph.serves == ((1,), (), ())
    assert graph.cyclic == frozenset()
    assert sorted(sorted(c) for c in graph.components()) == [[0, 1], [2]]


def test_a_swap_is_a_cycle() -> None:
    instance = _instance(_running("x", "n0", 8), _running("y", "n1", 8))
    plan = Plan(
        policy="test",
        actions=[
            _action(ActionKind.migrate, "x", {"n0": 8}, {"n1": 8}),
            _action(ActionKind.migrate, "y", {"n1": 8}, {"n0": 8}),
        ],
    )
    graph = action_graph(instance, plan)
    assert graph.depends_on == ((1,), (0,))
    assert graph.cyclic == frozenset({0, 1})


def test_takers_that_fit_the_free_gpus_do_not_wait_for_a_stop_on_the_same_node() -> None:
    instance = _instance(_running("low", "n0", 4), _pending("a", 2), _pending("b", 6))
    plan = Plan(
        policy="test",
        actions=[
            _action(ActionKind.preempt, "low", {"n0": 4}, {}),
            _action(ActionKind.start, "a", {}, {"n0": 2}),
            _action(ActionKind.start, "b", {}, {"n0": 6}),
        ],
    )
    graph = action_graph(instance, plan)
    # 4 GPUs are free: "a" (2) starts at once; "b" (6) takes the other 2 free and 4 freed.
    assert graph.depends_on == ((), (), (0,))


def _service(job_id: str, placement: dict[str, int], *, movable: bool = True) -> Job:
    return Job(
        id=job_id,
        shape=JobShape.elastic,
        gpus_per_replica=2,
        replicas=sum(placement.values()) // 2,
        min_replicas=1,
        max_replicas=8,
        placement=placement,
        start_time=0,
        migratable=movable,
    )


def test_a_service_whose_replicas_move_shrinks_first_and_comes_back_after_the_gang() -> None:
    """Two replicas on n0 and one on n1; the plan moves n0's pair to n2 so a gang takes n0.
    Carried out as: shrink off n0 (the gang waits for it), then grow back, which waits for
    the gang: a scheduler placing the returning replicas itself cannot put them on n0."""
    service = _service("svc", {"n0": 4, "n1": 2})
    instance = _instance(service, _running("other", "n0", 4), _pending("gang", 8))
    moved = _action(ActionKind.resize, "svc", {"n0": 4, "n1": 2}, {"n1": 2, "n2": 4})
    plan = Plan(
        policy="test",
        actions=[
            moved.model_copy(update={"replicas": 3}),
            _action(ActionKind.migrate, "other", {"n0": 4}, {"n1": 4}),
            _action(ActionKind.start, "gang", {}, {"n0": 8}),
        ],
    )
    split = split_replica_moves(instance, plan)
    kinds = [
        (a.kind, a.job_id, a.from_placement, a.to_placement, a.replicas) for a in split.actions
    ]
    assert kinds == [
        (ActionKind.resize, "svc", {"n0": 4, "n1": 2}, {"n1": 2}, 1),
        (ActionKind.resize, "svc", {"n1": 2}, {"n1": 2, "n2": 4}, 3),
        (ActionKind.migrate, "other", {"n0": 4}, {"n1": 4}, None),
        (ActionKind.start, "gang", {}, {"n0": 8}, None),
    ]
    graph = action_graph(instance, split)
    # The gang (3) waits for the shrink (0) and the move (2); the growth back (1) waits for
    # the shrink and for the gang the shrink made room for.
    assert graph.depends_on[3] == (0, 2)
    assert graph.depends_on[1] == (0, 3)
    assert graph.cyclic == frozenset()
    assert sorted(sorted(c) for c in graph.components()) == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    ("service", "after"),
    [
        # Its connector cannot choose which replicas leave: as the plan has it.
        (_service("svc", {"n0": 2, "n1": 2}, movable=False), {"n1": 2, "n2": 2}),
        # A plain shrink or growth moves nothing.
        (_service("svc", {"n0": 2, "n1": 2}), {"n1": 2}),
        (_service("svc", {"n0": 2, "n1": 2}), {"n0": 2, "n1": 2, "n2": 2}),
        # Every replica leaves: shrinking first would stop the service.
        (_service("svc", {"n0": 4}), {"n2": 4}),
    ],
)
def test_what_is_not_a_replica_move_is_not_split(service: Job, after: dict[str, int]) -> None:
    plan = Plan(
        policy="test", actions=[_action(ActionKind.resize, "svc", service.placement, after)]
    )
    assert split_replica_moves(_instance(service), plan) is plan


def test_a_jobs_second_action_waits_for_its_first_even_without_gpus_between_them() -> None:
    service = _service("svc", {"n0": 2, "n1": 2})
    plan = Plan(
        policy="test",
        actions=[
            _action(ActionKind.resize, "svc", {"n0": 2, "n1": 2}, {"n1": 2}),
            _action(ActionKind.resize, "svc", {"n1": 2}, {"n1": 2, "n2": 2}),
        ],
    )
    assert action_graph(_instance(service), plan).depends_on == ((), (0,))


def test_a_move_that_would_stop_a_service_is_held_with_what_depends_on_it() -> None:
    """Every replica leaving (or fewer than min_replicas staying) cannot shrink first: the
    move and the gang start it makes room for are held whole; other actions go on."""
    service = _service("svc", {"n0": 2, "n1": 2}).model_copy(update={"min_replicas": 2})
    instance = _instance(
        service, _running("other", "n0", 6), _pending("gang", 8), _pending("small", 2)
    )
    plan = Plan(
        policy="test",
        actions=[
            _action(ActionKind.resize, "svc", {"n0": 2, "n1": 2}, {"n1": 2, "n2": 2}),
            _action(ActionKind.migrate, "other", {"n0": 6}, {"n1": 6}),
            _action(ActionKind.start, "gang", {}, {"n0": 8}),
            _action(ActionKind.start, "small", {}, {"n2": 2}),
        ],
    )
    assert split_replica_moves(instance, plan) is plan  # one would stay: min is 2
    held = unsplit_replica_moves(instance, plan)
    assert sorted(held) == [0, 1, 2]
    assert "fewer than 2 where they are" in held[2]
    moved_whole = plan.model_copy(
        update={"actions": [_action(ActionKind.resize, "svc", {"n0": 2, "n1": 2}, {"n2": 4})]}
    )
    assert (
        "fewer than 1"
        in unsplit_replica_moves(_instance(_service("svc", {"n0": 2, "n1": 2})), moved_whole)[0]
    )
    assert unsplit_replica_moves(instance, Plan(policy="test")) == {}
