"""MIG jobs in the solver: the geometry (``solver.mig``), ``Job.mig_profile`` and its
validation at the edge, their placement (``solver.greedy.mig_placement``) through every
policy, and the validator's MIG rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from solver import mig
from solver.greedy.mig_placement import split
from solver.instance import GpuModel, Instance, Job, Node, SlaPolicy, SolverConfig
from solver.mig import A100_40GB, A100_80GB, GpuLayout, MigProfile, MigSlice
from solver.plan import ActionKind, Plan, ReasonCode
from solver.policies import get_policy
from solver.solve import solve
from solver.validate import validate

H100 = GpuModel(name="h100", memory_mib=81_920, mig_profiles=A100_80GB)
A100_40 = GpuModel(name="a100-40", memory_mib=40_960, mig_profiles=A100_40GB)
PLAIN = GpuModel(name="l40s", memory_mib=49_152)  # no MIG
CONFIG = SolverConfig(use_cp_sat=False)
PROFILE = {profile.name: profile for profile in A100_80GB}


def _layout(*slices: tuple[str, int]) -> GpuLayout:
    return GpuLayout(
        A100_80GB,
        [MigSlice(f"s{i}", PROFILE[name], start) for i, (name, start) in enumerate(slices)],
    )


def _nodes(count: int = 1, gpus: int = 1, model: str = "h100") -> tuple[Node, ...]:
    return tuple(
        Node(name=f"n{i}", cluster="c", gpu_model=model, gpus=gpus, cpu_milli=64_000)
        for i in range(count)
    )


def _mig(job_id: str, profile: str, where: tuple[str, int, int] | None = None, **kw: object) -> Job:
    if where is None:
        return Job(id=job_id, mig_profile=profile, **kw)
    node, gpu, start = where
    return Job(
        id=job_id,
        mig_profile=profile,
        placement={node: 1},
        gpu_indices={node: (gpu,)},
        mig_start=start,
        start_time=0.0,
        **kw,
    )


def _instance(*jobs: Job, nodes: tuple[Node, ...] | None = None, **kw: object) -> Instance:
    return Instance(
        gpu_models=(H100, A100_40, PLAIN),
        nodes=nodes if nodes is not None else _nodes(),
        jobs=jobs,
        config=kw.pop("config", CONFIG),
        **kw,
    )


# --- geometry ----------------------------------------------------------------------------


def test_seven_1g_slices_fill_an_80gb_gpu() -> None:
    layout = GpuLayout(A100_80GB)
    starts = [mig.place(layout, PROFILE["1g.10gb"], f"j{i}") for i in range(7)]
    assert sorted(s for s in starts if s is not None) == list(range(7))
    assert layout.free_compute_slices == 0
    assert not any(mig.fits(layout, profile) for profile in A100_80GB)
    assert mig.place(layout, PROFILE["1g.10gb"], "j7") is None
    assert len(layout.slices) == 7


def test_a_4g_then_a_3g_fit_and_nothing_more() -> None:
    layout = GpuLayout(A100_80GB)
    assert mig.place(layout, PROFILE["4g.40gb"], "a") == 0
    assert mig.place(layout, PROFILE["3g.40gb"], "b") == 4
    assert not any(mig.fits(layout, profile) for profile in A100_80GB)


def test_a_3g_at_start_0_blocks_a_4g_at_start_4_it_does_not() -> None:
    assert not mig.fits(_layout(("3g.40gb", 0)), PROFILE["4g.40gb"])
    assert mig.open_starts(_layout(("3g.40gb", 4)), PROFILE["4g.40gb"]) == (0,)
    # Two 3g fill the memory slices: no 1g fits although one compute slice is free.
    both = _layout(("3g.40gb", 0), ("3g.40gb", 4))
    assert both.free_compute_slices == 1
    assert not mig.fits(both, PROFILE["1g.10gb"])


def test_free_slices_by_count_are_not_enough() -> None:
    # 1g at slices 1 and 5: 6 memory and 5 compute slices free, but a 3g starts only at
    # 0 or 4 and a 4g only at 0, each crossing a held slice.
    layout = _layout(("1g.10gb", 1), ("1g.10gb", 5))
    assert layout.free_memory_slices == 6 and layout.free_compute_slices == 5
    assert not mig.fits(layout, PROFILE["3g.40gb"])
    assert not mig.fits(layout, PROFILE["4g.40gb"])
    assert mig.open_starts(layout, PROFILE["2g.20gb"]) == (2,)


def test_the_start_chosen_keeps_the_larger_profiles_placeable() -> None:
    empty = GpuLayout(A100_80GB)
    # A 1g goes to the last slot: the 4g at 0 and the 2g at 0, 2, 4 stay possible;
    # at slot 0 (the lowest) neither the 4g nor the 3g at 0 would be.
    assert mig.best_start(empty, PROFILE["1g.10gb"]) == 6
    assert mig.fits(_layout(("1g.10gb", 6)), PROFILE["4g.40gb"])
    assert not mig.fits(_layout(("1g.10gb", 0)), PROFILE["4g.40gb"])
    assert mig.best_start(empty, PROFILE["3g.40gb"]) == 4
    assert mig.best_start(empty, PROFILE["2g.20gb"]) == 4
    # Beside a 4g at 0, a 1g goes to 6, keeping the 2g at 4.
    assert mig.best_start(_layout(("4g.40gb", 0)), PROFILE["1g.10gb"]) == 6
    assert mig.room(_layout(("4g.40gb", 0), ("1g.10gb", 6)))[3] == 1  # the 2g at 4


def test_clash_reports_overlap_and_compute() -> None:
    held = [MigSlice("a", PROFILE["3g.40gb"], 4)]
    assert "overlaps a's 3g.40gb at memory slices 4-7" in str(
        mig.clash(held, MigSlice("b", PROFILE["1g.10gb"], 5))
    )
    assert mig.clash(held, MigSlice("b", PROFILE["4g.40gb"], 0)) is None


def test_the_tables_follow_nvidia_names() -> None:
    assert [p.name for p in A100_40GB] == [
        "1g.5gb",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]
    assert [p.name for p in A100_80GB][-1] == "7g.80gb"


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"starts": (5,)}, r"starts \[5\] out of range"),
        ({"starts": (4, 0)}, "ascending"),
        ({"starts": ()}, "starts"),
        ({"compute_slices": 8}, "compute_slices"),
    ],
)
def test_profile_rejects_a_bad_geometry(fields: dict[str, object], names: str) -> None:
    base: dict[str, object] = {
        "name": "3g.40gb",
        "compute_slices": 3,
        "memory_slices": 4,
        "starts": (0, 4),
    }
    with pytest.raises(ValidationError, match=names):
        MigProfile.model_validate({**base, **fields})


def test_gpu_model_rejects_a_profile_named_twice() -> None:
    with pytest.raises(ValidationError, match="mig_profiles names a profile twice"):
        GpuModel(name="x", memory_mib=1, mig_profiles=(PROFILE["1g.10gb"], PROFILE["1g.10gb"]))


# --- the edge ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"mig_profile": ""}, "mig_profile"),
        ({"mig_profile": "3g.40gb", "replicas": 2}, "replicas=1"),
        ({"mig_profile": "3g.40gb", "gpus_per_replica": 2}, "gpus_per_replica=1"),
        ({"mig_profile": "3g.40gb", "shape": "elastic"}, "block"),
        ({"mig_profile": "3g.40gb", "gpu_milli": 500}, "gpu_milli"),
        ({"mig_profile": "3g.40gb", "mig_start": 4}, "mig_start is only for a running"),
        ({"mig_start": 4}, "mig_start=4 without a mig_profile"),
        ({"mig_profile": "3g.40gb", "mig_start": 8}, "mig_start"),
        (
            {"mig_profile": "3g.40gb", "placement": {"n0": 1}, "gpu_indices": {"n0": (0,)}},
            "needs mig_start",
        ),
        ({"mig_profile": "3g.40gb", "placement": {"n0": 1}, "mig_start": 4}, "gpu_indices"),
    ],
)
def test_job_rejects_inconsistent_mig_fields(fields: dict[str, object], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        Job.model_validate({"id": "j", **fields})


def test_instance_rejects_slices_the_geometry_forbids() -> None:
    with pytest.raises(ValidationError, match=r"overlaps a's 3g.40gb at memory slices 4-7"):
        _instance(_mig("a", "3g.40gb", ("n0", 0, 4)), _mig("b", "1g.10gb", ("n0", 0, 5)))
    with pytest.raises(ValidationError, match=r"mig_start=2 is not a start of 3g.40gb"):
        _instance(_mig("a", "3g.40gb", ("n0", 0, 2)))
    with pytest.raises(ValidationError, match=r"'3g.40gb' is not a MIG profile of a100-40"):
        _instance(_mig("a", "3g.40gb", ("n0", 0, 4)), nodes=_nodes(model="a100-40"))
    with pytest.raises(ValidationError, match=r"its profiles: none"):
        _instance(_mig("a", "1g.10gb", ("n0", 0, 6)), nodes=_nodes(model="l40s"))
    with pytest.raises(ValidationError, match=r"names GPU 3 of n0, which has 1 GPUs"):
        _instance(_mig("a", "1g.10gb", ("n0", 3, 6)))
    whole = Job(id="w", placement={"n0": 1}, gpu_indices={"n0": (0,)})
    with pytest.raises(ValidationError, match=r"job w: gpu_indices names GPU 0 of n0, which MIG"):
        _instance(_mig("a", "1g.10gb", ("n0", 0, 6)), whole)
    # 1g.5gb is the 40 GB A100's: fine there.
    assert _instance(_mig("a", "1g.5gb", ("n0", 0, 6)), nodes=_nodes(model="a100-40"))


def test_an_instance_without_mig_jobs_is_not_split_and_dumps_no_starts() -> None:
    instance = _instance(Job(id="w"))
    assert split(instance) is None
    assert "mig_starts" not in solve(instance).model_dump()


# --- planning ----------------------------------------------------------------------------


def test_a_3g_then_a_4g_share_one_gpu() -> None:
    # The 3g comes first; at start 0 (the lowest) it would leave the 4g no room on the
    # one GPU there is. At start 4 both fit.
    instance = _instance(
        _mig("a", "3g.40gb", submit_time=0.0), _mig("b", "4g.40gb", submit_time=1.0)
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.mig_starts == {"a": 4, "b": 0}
    assert plan.gpu_indices["a"] == plan.gpu_indices["b"] == {"n0": (0,)}
    (start,) = plan.actions_for("a")
    assert start.kind is ActionKind.start
    assert start.reason.message == "3g.40gb at memory slices 4-7 of GPU 0 on n0"


def test_partitioned_gpus_are_filled_before_idle_ones_and_whole_jobs_stay_off_them() -> None:
    # n0 has 2 GPUs; GPU 0 holds a running 1g. A 2-GPU job cannot start; a 1-GPU job
    # takes GPU 1; the pending 2g goes beside the 1g on GPU 0.
    nodes = _nodes(gpus=2)
    running = _mig("r", "1g.10gb", ("n0", 0, 6))
    gang = _instance(running, Job(id="w2", gpus_per_replica=2), nodes=nodes)
    plan = solve(gang)
    assert validate(gang, plan) == []
    assert "w2" in plan.pending
    assert plan.mig_starts == {"r": 6}
    instance = _instance(running, Job(id="w1"), _mig("m", "2g.20gb"), nodes=nodes)
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.gpu_indices["w1"] == {"n0": (1,)}
    assert plan.gpu_indices["m"] == {"n0": (0,)}
    assert plan.mig_starts == {"r": 6, "m": 4}


def test_a_mig_job_that_fits_nowhere_waits_with_the_reason() -> None:
    # GPU 0 holds 1g at slices 1 and 5 (a start the plan keeps as given), GPU 1 a whole
    # job: 6 memory and 5 compute slices are free, but not where a 3g may start.
    nodes = _nodes(gpus=2)
    jobs = (
        _mig("a", "1g.10gb", ("n0", 0, 1)),
        _mig("b", "1g.10gb", ("n0", 0, 5)),
        Job(id="w", placement={"n0": 1}, gpu_indices={"n0": (1,)}, start_time=0.0),
    )
    instance = _instance(*jobs, _mig("m", "3g.40gb"), nodes=nodes)
    plan = solve(instance)
    assert validate(instance, plan) == []
    reason = plan.pending["m"]
    assert reason.code is ReasonCode.fragmentation
    assert "GPU 0 of n0 holds 1g.10gb at memory slices 1-1" in reason.message
    # A 2g fits at 2, the one start left for it.
    instance = _instance(*jobs, _mig("m", "2g.20gb"), nodes=nodes)
    assert solve(instance).mig_starts["m"] == 2
    # No GPU at all: insufficient capacity; no node with the profile: no compatible model.
    full = _instance(
        Job(id="w", placement={"n0": 1}, gpu_indices={"n0": (0,)}, start_time=0.0),
        _mig("m", "3g.40gb"),
    )
    assert solve(full).pending["m"].code is ReasonCode.insufficient_capacity
    other = _instance(_mig("m", "3g.40gb"), nodes=_nodes(model="a100-40"))
    reason = solve(other).pending["m"]
    assert reason.code is ReasonCode.no_compatible_gpu_model
    assert "MIG profile 3g.40gb" in reason.message


@pytest.mark.parametrize("policy", ["fifo", "backfill", "priority", "shaper"])
def test_every_policy_places_mig_jobs_around_whole_gpus_and_shares(policy: str) -> None:
    jobs = (
        _mig("r", "3g.40gb", ("n1", 1, 4)),
        _mig("a", "4g.40gb"),
        _mig("b", "1g.10gb"),
        _mig("c", "1g.10gb"),
        Job(id="w", gpus_per_replica=2),
        Job(id="s", gpu_milli=500),
    )
    config = SolverConfig(time_limit_s=2.0, num_workers=1, deterministic=True)
    instance = _instance(*jobs, nodes=_nodes(count=2, gpus=4), config=config)
    plan = get_policy(policy).plan(instance)
    assert validate(instance, plan) == [], policy
    assert set(plan.placement) == {"r", "a", "b", "c", "w", "s"}, policy
    # The 4g fills the running 3g's GPU (its one start, 0, is free); the two 1g share one
    # idle GPU; no whole-GPU job or share is on a partitioned GPU.
    assert plan.gpu_indices["a"] == plan.gpu_indices["r"] == {"n1": (1,)}
    assert plan.mig_starts["a"] == 0
    assert plan.gpu_indices["b"] == plan.gpu_indices["c"]
    partitioned = {(n, i[0]) for j in ("r", "a", "b", "c") for n, i in plan.gpu_indices[j].items()}
    whole = {(n, i) for n, idx in plan.gpu_indices["w"].items() for i in idx}
    shared = {(n, i[0]) for n, i in plan.gpu_indices["s"].items()}
    assert whole.isdisjoint(partitioned) and shared.isdisjoint(partitioned)


def test_validate_rejects_what_the_geometry_forbids() -> None:
    instance = _instance(
        _mig("a", "3g.40gb"), _mig("b", "4g.40gb"), Job(id="w"), nodes=_nodes(gpus=2)
    )
    plan = solve(instance)
    assert validate(instance, plan) == []

    def rules(**update: object) -> list[str]:
        return [f"{v.rule}:{v.message}" for v in validate(instance, plan.model_copy(update=update))]

    overlap = rules(mig_starts={"a": 0, "b": 0})
    assert any(r.startswith("mig:") and "overlaps" in r for r in overlap)
    forbidden = rules(mig_starts={"a": 2, "b": 0})
    assert any("3g.40gb may not start at memory slice 2 (only at [0, 4])" in r for r in forbidden)
    missing = rules(mig_starts={"b": 0})
    assert any("placed without its start" in r for r in missing)
    gpu = plan.gpu_indices["a"]["n0"]
    on_partitioned = rules(gpu_indices={**plan.gpu_indices, "w": {"n0": gpu}})
    assert any("which MIG slices partition" in r for r in on_partitioned)
    stray = rules(mig_starts={**plan.mig_starts, "w": 0})
    assert any("not a placed MIG job" in r for r in stray)
    # A profile the node's model does not have.
    small = _instance(_mig("a", "3g.40gb"), nodes=_nodes(model="a100-40"))
    assert "a" in solve(small).pending
    hand = Plan(
        policy="hand",
        placement={"a": {"n0": 1}},
        gpu_indices={"a": {"n0": (0,)}},
        mig_starts={"a": 4},
    )
    bad = validate(small, hand)
    assert any("has no MIG profile 3g.40gb" in v.message for v in bad)


def test_validate_counts_a_moved_slice_as_a_migration() -> None:
    instance = _instance(_mig("a", "1g.10gb", ("n0", 0, 6)))
    plan = solve(instance)
    assert plan.mig_starts == {"a": 6} and not plan.actions
    moved = plan.model_copy(update={"mig_starts": {"a": 5}})
    found = {(v.rule, v.message) for v in validate(instance, moved)}
    assert ("movement", "non-checkpointable job moved") in found
    assert ("actions", "changed with 0 actions") in found


def test_an_overdue_mig_job_is_not_owed_a_gpu_without_its_profile() -> None:
    # Past its max queue wait, and n1 (no MIG) has an idle GPU: the plan is still valid,
    # because no GPU of n1's model can hold the slice.
    policy = SlaPolicy(team="t", max_queue_wait_s=60.0)
    nodes = (*_nodes(), Node(name="n1", cluster="c", gpu_model="l40s", gpus=1))
    busy = Job(id="w", placement={"n0": 1}, gpu_indices={"n0": (0,)}, start_time=0.0)
    late = _mig("m", "3g.40gb", team="t", submit_time=0.0)
    instance = _instance(busy, late, nodes=nodes, policies=(policy,), now=3600.0)
    assert instance.is_overdue(late)
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.pending["m"].code is ReasonCode.insufficient_capacity
    # With n0's GPU idle it is placed there (and the validator asks for it).
    idle = _instance(late, nodes=nodes, policies=(policy,), now=3600.0)
    plan = solve(idle)
    assert plan.gpu_indices["m"] == {"n0": (0,)}
    unplaced = Plan(policy="hand", pending={"m": plan.actions[0].reason})
    assert [v.rule for v in validate(idle, unplaced)] == ["overdue"]


def test_a_mig_job_waits_for_its_teams_quota() -> None:
    policy = SlaPolicy(team="t", guaranteed_gpus=1, borrowing_limit=0)
    running = Job(id="w", team="t", placement={"n0": 1}, gpu_indices={"n0": (0,)}, start_time=0.0)
    instance = _instance(
        running, _mig("m", "1g.10gb", team="t"), nodes=_nodes(gpus=2), policies=(policy,)
    )
    plan = solve(instance)
    assert validate(instance, plan) == []
    assert plan.pending["m"].code is ReasonCode.quota
