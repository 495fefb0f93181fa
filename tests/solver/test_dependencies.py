"""Which actions of a plan wait for which (solver.dependencies)."""

from __future__ import annotations

from solver.dependencies import action_graph, gpu_changes
from solver.instance import GpuModel, Instance, Job, Node
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
