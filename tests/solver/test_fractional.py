"""Fractional GPUs in the solver: ``Job.gpu_milli``, its validation, and its placement
(``solver.greedy.sharing``) through ``solve()`` and the greedy policies."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from solver.fragmentation import fgd_score, node_fragmentation
from solver.greedy.sharing import split
from solver.instance import GpuModel, Instance, Job, Node, SlaPolicy, SolverConfig, TypicalShape
from solver.mig import A100_80GB
from solver.plan import ActionKind, ReasonCode
from solver.policies import get_policy
from solver.solve import solve
from solver.validate import validate

A100 = GpuModel(name="a100", memory_mib=80_000)
CONFIG = SolverConfig(use_cp_sat=False)


def _nodes(count: int = 2, gpus: int = 2) -> tuple[Node, ...]:
    return tuple(
        Node(name=f"n{i}", cluster="c", gpu_model="a100", gpus=gpus, cpu_milli=64_000)
        for i in range(count)
    )


def _share(job_id: str, milli: int, where: tuple[str, int] | None = None, **kw: object) -> Job:
    if where is None:
        return Job(id=job_id, gpu_milli=milli, **kw)
    node, gpu = where
    return Job(
        id=job_id,
        gpu_milli=milli,
        placement={node: 1},
        gpu_indices={node: (gpu,)},
        start_time=0.0,
        **kw,
    )


def _instance(*jobs: Job, nodes: tuple[Node, ...] | None = None, **kw: object) -> Instance:
    return Instance(
        gpu_models=(A100,),
        nodes=nodes if nodes is not None else _nodes(),
        jobs=jobs,
        config=kw.pop("config", CONFIG),
        **kw,
    )


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"gpu_milli": 0}, "gpu_milli"),
        ({"gpu_milli": 1001}, "gpu_milli"),
        ({"gpu_milli": 500, "replicas": 2}, "fractional gang across GPUs"),
        ({"gpu_milli": 500, "gpus_per_replica": 2}, "fractional gang across GPUs"),
        ({"gpu_milli": 500, "placement": {"n0": 1}}, "gpu_indices"),
        ({"gpu_milli": 500, "shape": "elastic"}, "block"),
    ],
)
def test_job_rejects_inconsistent_fractions(fields: dict[str, object], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        Job(id="j", **fields)


def test_instance_rejects_a_gpu_shared_past_its_capacity() -> None:
    with pytest.raises(ValidationError, match=r"gpu_milli on GPU 0 of n0 adds up to 1100"):
        _instance(_share("a", 600, ("n0", 0)), _share("b", 500, ("n0", 0)))
    with pytest.raises(ValidationError, match=r"names GPU 5 of n0, which has 2 GPUs"):
        _instance(_share("a", 600, ("n0", 5)))
    whole = Job(id="w", placement={"n0": 1}, gpu_indices={"n0": (0,)})
    with pytest.raises(ValidationError, match=r"job w: gpu_indices names GPU 0 of n0"):
        _instance(_share("a", 600, ("n0", 0)), whole)


def test_whole_gpu_instance_is_not_split() -> None:
    assert split(_instance(Job(id="w"))) is None


def test_fractional_jobs_share_one_gpu_and_the_plan_names_it() -> None:
    instance = _instance(_share("a", 500), _share("b", 500), _share("c", 300), Job(id="w"))
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert set(plan.placement) == {"a", "b", "c", "w"}
    gpus = {
        (node, indices[0])
        for job in ("a", "b", "c")
        for node, indices in plan.gpu_indices[job].items()
    }
    assert len(gpus) == 2  # three shares on two GPUs, not three
    for action in plan.actions:
        if action.job_id in ("a", "b", "c"):
            assert action.kind is ActionKind.start
            assert "milli of GPU" in action.reason.message
    whole = {(n, i) for n, idx in plan.gpu_indices["w"].items() for i in idx}
    assert whole.isdisjoint(gpus)


def test_a_shared_gpu_stays_out_of_reach_of_whole_gpu_jobs() -> None:
    # One node of 2 GPUs, one shared by a running job: a 2-GPU job cannot start.
    instance = _instance(
        _share("a", 100, ("n0", 1)), Job(id="w", gpus_per_replica=2), nodes=_nodes(1)
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert "w" not in plan.placement
    assert plan.gpu_indices["a"] == {"n0": (1,)}


def test_fgd_prefers_the_gpu_that_keeps_whole_gpus_free() -> None:
    # n0 GPU 0 has 600 free; a 500 share there keeps every other GPU whole, which the
    # expected work (whole GPUs only) needs.
    whole_work = (TypicalShape(share=1.0),)
    instance = _instance(_share("a", 400, ("n0", 0)), _share("b", 500), typical_shapes=whole_work)
    assert solve(instance).gpu_indices["b"] == {"n0": (0,)}
    # For work of 400- and 500-milli shares alone, an idle GPU is better: 600 free still
    # takes either, 100 free takes neither.
    assert solve(instance.model_copy(update={"typical_shapes": ()})).gpu_indices["b"] == {
        "n0": (1,)
    }


def test_no_room_repacks_checkpointable_shares_within_a_node() -> None:
    # n0: GPU 0 holds 600, GPU 1 holds 600 (movable); a 700 share fits only if the 600
    # on GPU 1 moves... it cannot (600 + 600 > 1000); use 300s instead.
    instance = _instance(
        _share("a", 600, ("n0", 0)),
        _share("b", 300, ("n0", 1), checkpointable=True),
        _share("c", 800),
        nodes=_nodes(1),
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.gpu_indices["b"] == {"n0": (0,)}
    assert plan.gpu_indices["c"] == {"n0": (1,)}
    (move,) = plan.actions_for("b")
    assert move.kind is ActionKind.migrate
    assert move.reason.message == "GPU 1 -> GPU 0 on n0"
    off = instance.model_copy(update={"config": CONFIG.model_copy(update={"migration": False})})
    assert "c" in solve(off).pending


def test_greedy_policies_place_fractional_jobs_too() -> None:
    instance = _instance(_share("a", 500), _share("b", 500), Job(id="w", gpus_per_replica=2))
    for name in ("fifo", "backfill", "priority"):
        plan = get_policy(name).plan(instance)
        assert validate(instance, plan) == [], name
        assert set(plan.placement) == {"a", "b", "w"}, name


def test_validate_catches_an_overfull_gpu_and_an_unnamed_index() -> None:
    instance = _instance(_share("a", 600), _share("b", 600))
    plan = solve(instance)
    bad = plan.model_copy(update={"gpu_indices": {**plan.gpu_indices, "b": plan.gpu_indices["a"]}})
    assert any(
        v.rule == "capacity" and "1200 gpu_milli" in v.message for v in validate(instance, bad)
    )
    missing = plan.model_copy(
        update={"gpu_indices": {k: v for k, v in plan.gpu_indices.items() if k != "a"}}
    )
    assert any(v.rule == "indices" and v.job_id == "a" for v in validate(instance, missing))


def test_node_fragmentation_and_score() -> None:
    shapes = (TypicalShape(gpu_milli=500, share=0.5), TypicalShape(gpus=0, share=0.5))
    # GPUs 300 and 1000 free: the 500 shape finds the 300 fragmented; CPU-only, all.
    assert node_fragmentation([300, 1000], 1000, "a100", shapes) == 0.5 * 300 + 0.5 * 1300
    assert fgd_score(0) == 50
    assert fgd_score(5000) == 99


def test_typical_shapes_make_whole_gpu_placement_fragmentation_aware() -> None:
    # A 1-GPU job with 4 cores: best fit takes n0 (2 GPUs), whose last GPU is then left
    # with too little CPU for the expected 8-core 1-GPU work; FGD's score takes n1.
    nodes = (
        Node(name="n0", cluster="c", gpu_model="a100", gpus=2, cpu_milli=10_000),
        Node(name="n1", cluster="c", gpu_model="a100", gpus=4, cpu_milli=64_000),
    )
    job = Job(id="w", cpu_milli_per_replica=4_000)
    plain = _instance(job, nodes=nodes)
    assert solve(plain).placement["w"] == {"n0": 1}
    aware = _instance(job, nodes=nodes, typical_shapes=(TypicalShape(cpu_milli=8_000, share=1.0),))
    plan = solve(aware)
    assert plan.placement["w"] == {"n1": 1}
    assert validate(aware, plan) == []


# A team's quota counts each of its shares as one GPU (as ``validate`` does), in the
# whole-GPU plan the shares are split from too: a found bug had the holders of shared GPUs
# belong to no team, so a whole-GPU job took the team past its cap.
CAP_4 = SlaPolicy(team="t", guaranteed_gpus=2, borrowing_limit=2)
POLICY_CONFIGS = [
    ("shaper", SolverConfig(use_cp_sat=False)),
    ("shaper", SolverConfig(use_cp_sat=True)),
    ("priority", CONFIG),
    ("fifo", CONFIG),
    ("backfill", CONFIG),
]


@pytest.mark.parametrize(("policy", "config"), POLICY_CONFIGS)
def test_running_shares_count_against_the_teams_quota(policy: str, config: SolverConfig) -> None:
    shares = (_share("s1", 500, ("n0", 0), team="t"), _share("s2", 500, ("n0", 1), team="t"))
    for gpus, fits in ((3, False), (2, True)):  # 2 shares + 3 GPUs > 4; + 2 GPUs = 4
        instance = _instance(
            *shares,
            Job(id="w", team="t", gpus_per_replica=gpus),
            nodes=_nodes(gpus=4),
            policies=(CAP_4,),
            config=config,
        )
        plan = get_policy(policy).plan(instance)
        assert validate(instance, plan) == []
        if fits:
            assert sum(plan.placement["w"].values()) == gpus
        else:
            assert "w" not in plan.placement
            assert plan.pending["w"].code is ReasonCode.quota


@pytest.mark.parametrize(("policy", "config"), POLICY_CONFIGS)
def test_a_pending_share_waits_for_its_teams_quota(policy: str, config: SolverConfig) -> None:
    full = Job(id="w", team="t", gpus_per_replica=4, placement={"n1": 4}, start_time=0.0)
    other = _share("o", 500, team="u")  # another team's share still starts
    instance = _instance(
        full,
        _share("p", 500, team="t"),
        other,
        nodes=_nodes(gpus=4),
        policies=(CAP_4,),
        config=config,
    )
    plan = get_policy(policy).plan(instance)
    assert validate(instance, plan) == []
    assert plan.pending["p"].code is ReasonCode.quota
    assert plan.pending["p"].message == "team t is at its quota of 4 GPUs"
    assert "o" in plan.placement


def test_running_mig_instances_count_against_the_quota_shares_are_placed_under() -> None:
    h100 = GpuModel(name="h100", memory_mib=81_920, mig_profiles=A100_80GB)
    nodes = tuple(
        Node(name=f"n{i}", cluster="c", gpu_model="h100", gpus=2, cpu_milli=64_000)
        for i in range(2)
    )
    migs = [
        Job(
            id=f"m{i}",
            team="t",
            mig_profile="1g.10gb",
            placement={"n0": 1},
            gpu_indices={"n0": (i,)},
            mig_start=0,
            start_time=0.0,
        )
        for i in range(2)
    ]
    whole = Job(id="w", team="t", gpus_per_replica=1, placement={"n1": 1}, start_time=0.0)
    cap = SlaPolicy(team="t", guaranteed_gpus=3, borrowing_limit=0)
    instance = Instance(
        gpu_models=(h100,),
        nodes=nodes,
        jobs=(*migs, whole, _share("p", 500, team="t")),
        policies=(cap,),
        config=CONFIG,
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.pending["p"].code is ReasonCode.quota
    # One MIG instance fewer, and the share has its GPU of the quota.
    fewer = instance.model_copy(update={"jobs": (migs[0], whole, _share("p", 500, team="t"))})
    plan = solve(fewer)
    assert validate(fewer, plan) == []
    assert "p" in plan.placement
