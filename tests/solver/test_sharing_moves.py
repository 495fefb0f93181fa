"""Moves of shares across nodes (``SolverConfig.share_moves_across_nodes``): a pending share
or single-node whole-GPU job that fits nowhere gets room by moving checkpointable shares
to other nodes (``solver.greedy.share_moves``, from ``solver.greedy.sharing``)."""

from __future__ import annotations

from solver.instance import GpuModel, Instance, Job, Node, SolverConfig
from solver.plan import Action, ActionKind
from solver.solve import solve
from solver.validate import validate
from tests.solver.test_fractional import _share as fractional_share

A100 = GpuModel(name="a100", memory_mib=80_000)
OFF = SolverConfig(use_cp_sat=False)
ON = OFF.model_copy(update={"share_moves_across_nodes": True})


def _nodes(*gpus: int) -> tuple[Node, ...]:
    return tuple(
        Node(name=f"n{i}", cluster="c", gpu_model="a100", gpus=count, cpu_milli=64_000)
        for i, count in enumerate(gpus)
    )


def _share(job_id: str, milli: int, where: tuple[str, int] | None = None, **kw: object) -> Job:
    """A share (``tests.solver.test_fractional``'s), checkpointable when running unless
    told otherwise."""
    if where is not None:
        kw.setdefault("checkpointable", True)
    return fractional_share(job_id, milli, where, **kw)


def _instance(*jobs: Job, nodes: tuple[Node, ...], config: SolverConfig = ON) -> Instance:
    return Instance(gpu_models=(A100,), nodes=nodes, jobs=jobs, config=config)


def _one_gpu_each() -> Instance:
    # n0: b (500, movable); n1: a (500, fixed). A 600 share fits on neither GPU; with b on
    # n1 (500 free there) n0's GPU is empty.
    return _instance(
        _share("b", 500, ("n0", 0)),
        _share("a", 500, ("n1", 0), checkpointable=False),
        _share("c", 600),
        nodes=_nodes(1, 1),
    )


def test_a_share_fits_after_a_share_moves_to_another_node() -> None:
    instance = _one_gpu_each()
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.placement["b"] == {"n1": 1}
    assert plan.gpu_indices["b"] == {"n1": (0,)}
    assert plan.gpu_indices["c"] == {"n0": (0,)}
    (move,) = plan.actions_for("b")
    assert move.kind is ActionKind.migrate
    assert move.from_placement == {"n0": 1}
    assert move.to_placement == {"n1": 1}
    assert move.reason.message == "GPU 0 on n0 -> GPU 0 on n1"


def test_the_setting_off_gives_the_old_plan() -> None:
    off = _one_gpu_each().model_copy(update={"config": OFF})
    plan = solve(off)
    assert validate(off, plan) == []
    assert "c" in plan.pending
    assert plan.placement["b"] == {"n0": 1}
    assert not plan.actions_for("b")
    # Nothing to move: the setting changes nothing, byte for byte.
    fits = _instance(_share("b", 300, ("n0", 0)), _share("c", 600), nodes=_nodes(1, 1))
    assert solve(fits).model_dump_json(exclude={"stats"}) == solve(
        fits.model_copy(update={"config": OFF})
    ).model_dump_json(exclude={"stats"})


def test_no_move_strands_a_share_or_passes_the_budget() -> None:
    # b has nowhere else to go (n1 has 400 free): it stays, c waits.
    stranded = _instance(
        _share("b", 500, ("n0", 0)),
        _share("a", 600, ("n1", 0), checkpointable=False),
        _share("c", 600),
        nodes=_nodes(1, 1),
    )
    plan = solve(stranded)
    assert validate(stranded, plan) == []
    assert "c" in plan.pending and plan.placement["b"] == {"n0": 1}
    no_budget = ON.model_copy(update={"max_migrations_per_cycle": 0})
    instance = _one_gpu_each().model_copy(update={"config": no_budget})
    assert "c" in solve(instance).pending
    unmovable = _one_gpu_each().model_copy(
        update={
            "jobs": (_share("b", 500, ("n0", 0), checkpointable=False), *_one_gpu_each().jobs[1:])
        }
    )
    assert "c" in solve(unmovable).pending


def test_a_whole_gpu_job_starts_on_a_gpu_a_moved_share_frees() -> None:
    # n0: GPU 0 a (500, fixed), GPU 1 b (300, movable); n1: x (500, fixed). No idle GPU
    # for w until b leaves n0's GPU 1 for n1.
    instance = _instance(
        _share("a", 500, ("n0", 0), checkpointable=False),
        _share("b", 300, ("n0", 1)),
        _share("x", 500, ("n1", 0), checkpointable=False),
        Job(id="w"),
        nodes=_nodes(2, 1),
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.placement["w"] == {"n0": 1}
    assert plan.gpu_indices["w"] == {"n0": (1,)}
    assert plan.placement["b"] == {"n1": 1}
    (start,) = plan.actions_for("w")
    assert start.kind is ActionKind.start
    off = instance.model_copy(update={"config": OFF})
    assert "w" in solve(off).pending


def test_a_share_of_another_gpu_moves_to_free_the_cpu_a_share_lacks() -> None:
    # n0 has an idle GPU but 2 cores left; b (8 cores, on GPU 0) can go to n1.
    nodes = (
        Node(name="n0", cluster="c", gpu_model="a100", gpus=2, cpu_milli=10_000),
        Node(name="n1", cluster="c", gpu_model="a100", gpus=1, cpu_milli=64_000),
    )
    instance = _instance(
        _share("b", 500, ("n0", 0), cpu_milli_per_replica=8_000),
        _share("a", 500, ("n1", 0), checkpointable=False),
        _share("c", 600, cpu_milli_per_replica=4_000),
        nodes=nodes,
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.placement["b"] == {"n1": 1}
    assert plan.placement["c"] == {"n0": 1}
    assert "c" in solve(instance.model_copy(update={"config": OFF})).pending


def test_validate_rejects_a_broken_move() -> None:
    instance = _one_gpu_each()
    plan = solve(instance)
    # The same move for a share that cannot be checkpointed.
    fixed = instance.model_copy(
        update={"jobs": (_share("b", 500, ("n0", 0), checkpointable=False), *instance.jobs[1:])}
    )
    assert any(v.rule == "movement" and v.job_id == "b" for v in validate(fixed, plan))
    # A migrate action that does not name where the share goes.
    wrong = [
        a.model_copy(update={"to_placement": {"n0": 1}}) if a.job_id == "b" else a
        for a in plan.actions
    ]
    assert any(
        v.rule == "actions" and v.job_id == "b"
        for v in validate(instance, plan.model_copy(update={"actions": wrong}))
    )
    # The move without its action.
    silent = [a for a in plan.actions if a.job_id != "b"]
    assert any(
        v.rule == "actions" and v.job_id == "b"
        for v in validate(instance, plan.model_copy(update={"actions": silent}))
    )
    # c put on n1 beside the moved b: 1100 milli on one GPU.
    crowded = plan.model_copy(
        update={
            "placement": {**plan.placement, "c": {"n1": 1}},
            "gpu_indices": {**plan.gpu_indices, "c": {"n1": (0,)}},
            "actions": [
                Action(kind=ActionKind.start, job_id="c", to_placement={"n1": 1}, reason=a.reason)
                if a.job_id == "c"
                else a
                for a in plan.actions
            ],
        }
    )
    assert any(v.rule == "capacity" for v in validate(instance, crowded))
