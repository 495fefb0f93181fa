"""Elastic training jobs (``BlockJob.min_gpus``/``max_gpus``/``scaling``): their speed at
another size, starts at any size in range, rescales (a checkpoint and a restart priced as
a migration) and the GPU-time ledger through them. Every figure is worked out by hand.

The builders' transfer is 1 GiB/s with no fixed overhead: a 10 GiB image checkpoints in
10 s, restores in 10 s, and a migration or a rescale costs 20 s."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.actions import Migrate, Preempt, Rescale, Resize, Start
from sim.adapter import SolverPlanner, to_actions
from sim.engine import JobStatus, Simulation
from sim.ledger import TOLERANCE_GPU_S
from sim.metrics import summarize
from sim.scenario import build_workload
from sim.workload import NodeEvent, Service
from solver.plan import Action, ActionKind, Plan, Reason, ReasonCode

from .builders import HOUR, ScriptedPlanner, at, elastic, job, workload

RESTART_S = 20.0  # checkpoint 10 s + restore 10 s
DUMP_S = 10.0


def run(wl, schedule, **kwargs) -> Simulation:
    planner = ScriptedPlanner(at(schedule))
    return Simulation(wl, planner, check_invariants=True, **kwargs).run()


# ------------------------------------------------------------------ the job's spec
def test_spec_validation_names_the_job() -> None:
    with pytest.raises(ValueError, match="job e: elastic training needs 1 <= min_gpus"):
        elastic("e", gpus=2, hours=1, min_gpus=3, max_gpus=4)
    with pytest.raises(ValueError, match="job e: elastic training needs"):
        elastic("e", gpus=4, hours=1, max_gpus=2)
    with pytest.raises(ValueError, match="job e: elastic training needs"):
        elastic("e", gpus=2, hours=1, min_gpus=0)
    with pytest.raises(ValueError, match=r"job e: scaling must be in \(0, 1\]"):
        elastic("e", gpus=2, hours=1, scaling=1.2)
    with pytest.raises(ValueError, match="job e: scaling"):
        elastic("e", gpus=2, hours=1, scaling=0.0)
    with pytest.raises(ValueError, match="job e: min_gpus=1 without max_gpus"):
        replace(job("e", gpus=2, hours=1), min_gpus=1)
    spec = elastic("e", gpus=2, hours=1, min_gpus=None, max_gpus=4, scaling=0.8)
    assert (spec.elastic, spec.min_size, spec.max_size) == (True, 2, 4)
    assert spec.size_factor(4) == pytest.approx(2**0.8)
    rigid = job("r", gpus=2, hours=1)
    assert (rigid.elastic, rigid.min_size, rigid.max_size, rigid.size_factor(4)) == (
        False,
        2,
        2,
        1.0,
    )


# ------------------------------------------------------------------------ starts
def test_twice_the_gpus_at_scaling_0_8_finish_in_work_over_2_to_the_0_8() -> None:
    wl = workload([elastic("a", gpus=2, hours=4, max_gpus=4, scaling=0.8)])
    sim = run(wl, {0: [Start("a", {"n0": 4})]})
    run_h = 4 / 2**0.8
    assert sim.jobs["a"].end_time == pytest.approx(run_h * HOUR)
    m = summarize(sim).metrics
    # Useful work is reference work (4 h on the 2 GPUs it asks for); held GPU-time is 4 GPUs.
    assert m["useful_gpu_hours"] == pytest.approx(8)
    assert m["productive_gpu_hours"] == pytest.approx(4 * run_h)
    assert m["allocated_block_gpu_hours"] == pytest.approx(4 * run_h)
    assert m["resizes"] == 0
    assert sim.counters.rejected_actions == 0


def test_an_elastic_job_starts_smaller_a_rigid_one_only_at_its_size() -> None:
    wl = workload(
        [
            elastic("a", gpus=2, hours=4, min_gpus=1, max_gpus=4, scaling=0.8),
            job("r", gpus=2, hours=1),
            elastic("big", gpus=2, hours=1, min_gpus=2, max_gpus=3),
        ],
        nodes=(("n0", 8),),
    )
    sim = run(
        wl,
        {
            0: [
                Start("a", {"n0": 1}),
                Start("r", {"n0": 1}),  # rigid: 2 or nothing
                Start("big", {"n0": 4}),  # above its max_gpus
                Start("big", {"n0": 1}),  # below its min_gpus
            ]
        },
    )
    assert sim.counters.rejected_actions == 3
    assert sim.counters.rejections["start"] == 3
    # One GPU of two at scaling 0.8: 0.5 ** 0.8 of its speed.
    assert sim.jobs["a"].end_time == pytest.approx(4 / 0.5**0.8 * HOUR)
    assert sim.jobs["r"].first_start is None
    assert sim.jobs["big"].first_start is None


def test_a_migration_moves_the_gpus_held_not_the_gpus_asked() -> None:
    wl = workload([elastic("a", gpus=2, hours=4, max_gpus=4)], nodes=(("n0", 4), ("n1", 4)))
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 4})],
            0.5: [Migrate("a", {"n1": 2})],  # its asked size: rejected
            1: [Migrate("a", {"n1": 4})],
        },
    )
    assert sim.counters.rejected_actions == 1
    assert sim.counters.migrations == 1
    # 1 h at rate 2, then 20 s of migration, then 2 h of work left at rate 2.
    assert sim.jobs["a"].end_time == pytest.approx(HOUR + RESTART_S + HOUR)


# ---------------------------------------------------------------------- rescales
def test_a_grow_in_place_costs_a_restart_and_speeds_the_rest_up() -> None:
    wl = workload([elastic("a", gpus=2, hours=4, max_gpus=4)], nodes=(("n0", 4), ("n1", 4)))
    sim = run(wl, {0: [Start("a", {"n0": 2})], 1: [Rescale("a", {"n0": 4})]})
    state = sim.jobs["a"]
    # 1 h at rate 1; 20 s of restart; 3 h of work left at rate 4/2 = 2: 1.5 h.
    assert state.end_time == pytest.approx(HOUR + RESTART_S + 1.5 * HOUR)
    m = summarize(sim).metrics
    assert m["resizes"] == 1 and state.resizes == 1
    assert m["migrations"] == 0
    # All four GPUs it holds after the restart wait for it; it left none.
    assert m["resize_gpu_hours"] == pytest.approx(4 * RESTART_S / HOUR)
    assert m["productive_gpu_hours"] == pytest.approx(8)
    assert m["allocated_block_gpu_hours"] == pytest.approx(8 + 4 * RESTART_S / HOUR)
    assert m["unaccounted_gpu_hours"] == pytest.approx(0, abs=1e-9)
    assert state.acted_at == [0.0, HOUR]
    assert state.moved_at == [HOUR]


def test_a_shrink_onto_another_node_pays_the_dump_on_the_gpus_it_left() -> None:
    wl = workload(
        [elastic("a", gpus=4, hours=4, min_gpus=2, max_gpus=4, scaling=0.8)],
        nodes=(("n0", 4), ("n1", 4)),
    )
    sim = run(wl, {0: [Start("a", {"n0": 4})], 1: [Rescale("a", {"n1": 2})]})
    state = sim.jobs["a"]
    rate = 0.5**0.8
    assert state.end_time == pytest.approx(HOUR + RESTART_S + 3 * HOUR / rate)
    m = summarize(sim).metrics
    # n0's 4 GPUs dump the checkpoint 10 s; n1's 2 wait 20 s for the checkpoint and restore.
    assert m["resize_gpu_hours"] == pytest.approx((4 * DUMP_S + 2 * RESTART_S) / HOUR)
    assert m["productive_gpu_hours"] == pytest.approx(4 + 2 * 3 / rate)
    assert m["unaccounted_gpu_hours"] == pytest.approx(0, abs=1e-6)


def test_a_shrink_frees_gpus_for_a_start_in_the_same_plan() -> None:
    wl = workload(
        [
            elastic("a", gpus=4, hours=4, min_gpus=2, max_gpus=4),
            job("b", gpus=2, hours=1, at_h=0.5),
        ],
        nodes=(("n0", 4),),
    )
    # The start comes first in the plan; the engine shrinks a before it starts b.
    sim = run(wl, {0: [Start("a", {"n0": 4})], 1: [Start("b", {"n0": 2}), Rescale("a", {"n0": 2})]})
    assert sim.counters.rejected_actions == 0
    a, b = sim.jobs["a"], sim.jobs["b"]
    # a keeps two of its GPUs: 3 h of work left at rate 2/4 after a 20 s restart.
    assert a.end_time == pytest.approx(HOUR + RESTART_S + 6 * HOUR)
    # b takes the two a left, which dump a's checkpoint for 10 s first.
    assert b.first_start == pytest.approx(HOUR)
    assert b.end_time == pytest.approx(HOUR + DUMP_S + HOUR)
    assert b.ledger.resize == pytest.approx(2 * DUMP_S)
    assert a.ledger.resize == pytest.approx(2 * RESTART_S)  # the dump was b's wait
    assert sim.check_ledger() == pytest.approx(0, abs=TOLERANCE_GPU_S)


def test_a_shrink_in_place_keeps_gpus_it_held() -> None:
    # b holds GPU 0 until 0.5 h, a GPUs 1 and 2; shrunk to one GPU, a keeps GPU 1 (not the
    # lowest free one), so only GPU 2 dumps its checkpoint.
    wl = workload(
        [job("b", gpus=1, hours=0.5), elastic("a", gpus=2, hours=4, max_gpus=4)],
        nodes=(("n0", 4),),
    )
    held = {}

    def script(sim: Simulation):
        hour = round(sim.now / HOUR, 6)
        if hour == 0:
            return [Start("b", {"n0": 1}), Start("a", {"n0": 2})]
        if hour == 1:
            return [Rescale("a", {"n0": 1})]
        if hour == 1.5:
            held.update(sim.jobs["a"].placement)
        return []

    sim = Simulation(wl, ScriptedPlanner(script), check_invariants=True).run()
    assert held == {"n0": (1,)}
    assert sim.jobs["a"].ledger.resize == pytest.approx(RESTART_S + DUMP_S)


def test_a_rescale_whose_target_is_taken_stays_where_it_was_at_no_cost() -> None:
    wl = workload(
        [elastic("a", gpus=2, hours=4, max_gpus=4), job("b", gpus=4, hours=8)],
        nodes=(("n0", 4), ("n1", 4)),
        horizon_h=12,
    )
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 2}), Start("b", {"n1": 4})],
            1: [Rescale("a", {"n0": 2, "n1": 2})],
        },
    )
    a = sim.jobs["a"]
    assert sim.counters.rejections["rescale"] == 1
    assert a.end_time == pytest.approx(4 * HOUR)
    assert a.resizes == 0 and sim.counters.resizes == 0
    assert a.ledger.resize == 0
    assert a.acted_at == [0.0]


def test_a_rescale_with_nowhere_to_land_leaves_the_job_queued_with_its_checkpoint() -> None:
    # a's target is taken (c on n2) and its own GPUs by d's rescale, which lands first.
    wl = workload(
        [
            elastic("a", gpus=2, hours=4, max_gpus=4),
            elastic("d", gpus=2, hours=4, max_gpus=4),
            job("c", gpus=2, hours=4),
        ],
        nodes=(("n0", 2), ("n1", 2), ("n2", 2)),
    )
    seen: dict[str, object] = {}

    def script(sim: Simulation):
        hour = round(sim.now / HOUR, 6)
        if hour == 0:
            return [Start("a", {"n0": 2}), Start("d", {"n1": 2}), Start("c", {"n2": 2})]
        if hour == 1:
            return [Rescale("d", {"n0": 2}), Rescale("a", {"n1": 2, "n2": 1})]
        if hour == 2:
            seen["status"] = sim.jobs["a"].status
            seen["stranded"] = sim.jobs["a"].stranded
            seen["progress"] = sim.jobs["a"].progress
            return [Start("a", {"n1": 1})]
        return []

    sim = Simulation(wl, ScriptedPlanner(script), check_invariants=True).run()
    assert seen == {"status": JobStatus.queued, "stranded": True, "progress": HOUR}
    a = sim.jobs["a"]
    assert not a.stranded
    # Restored (10 s) at 2 h, then 3 h of work at rate 1/2.
    assert a.end_time == pytest.approx(2 * HOUR + DUMP_S + 6 * HOUR)
    # d restarted on n0 at its own size: the restart's time is all it lost.
    assert sim.jobs["d"].end_time == pytest.approx(4 * HOUR + RESTART_S)
    assert sim.counters.resizes == 1 and sim.counters.migrations == 0
    assert a.ledger.lost == 0


def test_illegal_rescales_are_rejected() -> None:
    wl = workload(
        [
            elastic("queued", gpus=2, hours=4, at_h=0.5),
            job("rigid", gpus=1, hours=4, checkpointable=True),
            elastic("nockpt", gpus=1, hours=4, checkpointable=False),
            elastic("range", gpus=1, hours=4, min_gpus=1, max_gpus=2),
        ],
        nodes=(("n0", 4), ("n1", 4)),
    )
    sim = run(
        wl,
        {
            0: [Start("rigid", {"n0": 1}), Start("nockpt", {"n0": 1}), Start("range", {"n0": 1})],
            1: [
                Rescale("queued", {"n1": 2}),
                Rescale("rigid", {"n1": 2}),
                Rescale("nockpt", {"n1": 2}),
                Rescale("range", {"n1": 3}),
                Rescale("ghost", {"n1": 1}),
            ],
        },
    )
    assert sim.counters.rejections["rescale"] == 5
    assert sim.counters.resizes == 0
    assert sim.jobs["rigid"].end_time == pytest.approx(4 * HOUR)
    assert sim.jobs["range"].end_time == pytest.approx(4 * HOUR)


def test_the_ledger_holds_through_grow_preempt_restart_shrink_and_failure() -> None:
    wl = workload(
        [elastic("a", gpus=2, hours=4, max_gpus=4)],
        nodes=(("n0", 4), ("n1", 4)),
        events=[NodeEvent(5 * HOUR, "n1", "fail")],
        horizon_h=12,
    )
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 2})],
            1: [Rescale("a", {"n0": 4})],  # grow
            2: [Preempt("a", checkpoint=False)],  # loses what it did on 4 GPUs since 1 h
            3: [Start("a", {"n0": 3})],
            4: [Rescale("a", {"n0": 1, "n1": 1})],  # shrink, half of it to n1
            6: [Start("a", {"n0": 4})],  # after n1 failed at 5 h
        },
    )
    a = sim.jobs["a"]
    busy = HOUR - RESTART_S  # computing after each rescale's restart
    # Progress: 1 h (rate 1), lost 2 busy, 1.5 × (1 h − 10 s restore), lost 1 × busy, rest × 2.
    kept = HOUR + 1.5 * (HOUR - DUMP_S)
    remaining = 4 * HOUR - kept
    assert a.end_time == pytest.approx(6 * HOUR + DUMP_S + remaining / 2)
    assert sim.counters.resizes == 2
    assert sim.counters.preemptions == 1 and sim.counters.evictions == 1
    ledger = a.ledger
    # Work lost is the GPU-time it was made on: 4 GPUs, then 2 GPUs.
    assert ledger.lost == pytest.approx(4 * busy + 2 * busy)
    assert ledger.resize == pytest.approx(4 * RESTART_S + 2 * DUMP_S + 2 * RESTART_S)
    assert ledger.checkpoint == pytest.approx(3 * DUMP_S + 4 * DUMP_S)
    assert ledger.productive == pytest.approx(8 * HOUR)  # linear scaling: reference GPU-time
    assert ledger.allocated == pytest.approx(ledger.accounted())
    assert abs(sim.check_ledger()) < TOLERANCE_GPU_S
    m = summarize(sim).metrics
    assert m["resizes"] == 2
    assert m["lost_gpu_hours"] == pytest.approx(6 * busy / HOUR)


def test_the_ledger_holds_with_sublinear_scaling_and_a_cap() -> None:
    # Cut off at the horizon (no drain) while running on 3 GPUs, not checkpointable at the
    # end: its progress since the last rescale is in flight, on the GPUs it was made on.
    spec = elastic("a", gpus=2, hours=10, max_gpus=4, scaling=0.7)
    wl = workload([spec], nodes=(("n0", 4),), horizon_h=3)
    sim = run(
        wl,
        {0: [Start("a", {"n0": 2})], 1: [Rescale("a", {"n0": 3})], 2: [Rescale("a", {"n0": 1})]},
        drain=False,
    )
    ledger = sim.jobs["a"].ledger
    # A checkpointable job is checkpointed at the end: all of it is productive.
    assert ledger.in_flight == 0
    assert ledger.productive == pytest.approx(2 * HOUR + 3 * (HOUR - RESTART_S) + HOUR - RESTART_S)
    assert ledger.resize == pytest.approx(3 * RESTART_S + 2 * DUMP_S + RESTART_S)
    assert abs(sim.check_ledger()) < TOLERANCE_GPU_S
    expected = HOUR + 1.5**0.7 * (HOUR - RESTART_S) + 0.5**0.7 * (HOUR - RESTART_S)
    assert sim.jobs["a"].progress == pytest.approx(expected)


# ------------------------------------------------------------------------ YAML
def _scenario(mix: dict, jobs: list | None = None) -> dict:
    return {
        "name": "elastic",
        "seed": 3,
        "gpu_models": {"A100": {}},
        "cluster": [{"prefix": "n", "count": 4, "gpus": 8, "model": "A100"}],
        "jobs": jobs or [],
        "generate": {"count": 300, "mix": [mix]},
    }


def test_a_mix_entry_with_elastic_gives_jobs_in_range() -> None:
    mix = {"gpus": {1: 1, 2: 1, 3: 1, 4: 1, 8: 1}, "hours": 2, "checkpointable": 0.5}
    wl = build_workload(
        _scenario({**mix, "elastic": {"share": 0.7, "min": 0.5, "max": 2.0, "scaling": 0.8}})
    )
    flexible = [j for j in wl.jobs if j.elastic]
    assert 0.6 < len(flexible) / len(wl.jobs) < 0.8
    for j in flexible:
        assert j.min_gpus == max(1, math.floor(j.gpus * 0.5))
        assert j.max_gpus == math.ceil(j.gpus * 2.0)
        assert j.scaling == 0.8
    assert {j.min_gpus for j in flexible if j.gpus == 3} == {1}
    assert all(j.min_gpus is None and j.max_gpus is None for j in wl.jobs if not j.elastic)
    # Without the key: no job is elastic, and none is drawn differently.
    plain = build_workload(_scenario(mix))
    assert not any(j.elastic for j in plain.jobs)


def test_explicit_jobs_may_be_elastic() -> None:
    entry = {"id": "e", "gpus": 4, "hours": 1, "min_gpus": 2, "max_gpus": 8, "scaling": 0.9}
    wl = build_workload(_scenario({"gpus": 1, "hours": 1}, jobs=[entry]))
    spec = next(j for j in wl.jobs if j.id == "e")
    assert (spec.min_gpus, spec.max_gpus, spec.scaling) == (2, 8, 0.9)
    with pytest.raises(ValueError, match="job e: elastic training needs"):
        build_workload(_scenario({"gpus": 1, "hours": 1}, jobs=[{**entry, "min_gpus": 5}]))


# --------------------------------------------------------------------- adapter
def test_the_adapter_gives_the_solver_sizes_and_bounds() -> None:
    wl = workload(
        [
            elastic("a", gpus=2, hours=4, min_gpus=1, max_gpus=8),
            elastic("q", gpus=2, hours=4, min_gpus=None, max_gpus=4, at_h=0.5),
            job("r", gpus=2, hours=4, at_h=0.5),
        ],
        nodes=(("n0", 4), ("n1", 4)),
    )
    planner = SolverPlanner("fifo")
    seen = {}

    def script(sim: Simulation):
        hour = round(sim.now / HOUR, 6)
        if hour == 0:
            return [Start("a", {"n0": 4})]
        if hour in (1, 2):
            seen[hour] = {job.id: job for job in planner.instance(sim).jobs}
        if hour == 1:
            return [Rescale("a", {"n0": 1})]
        return []

    Simulation(wl, ScriptedPlanner(script), check_invariants=True).run()
    a, q, r = seen[1]["a"], seen[1]["q"], seen[1]["r"]
    # replicas is the size it asks; its placement, the size it runs at.
    assert (a.replicas, a.min_replicas, a.max_replicas) == (2, 1, 8)
    assert a.placement == {"n0": 4}
    # The spread limit of the 2 GPUs it asks (one 4-GPU node), scaled when it grows.
    assert (a.max_nodes, a.node_limit(2), a.node_limit(8)) == (1, 1, 4)
    # Running at rate 2 since 0: 4 h of work ends at 2 h.
    assert a.expected_runtime_s == pytest.approx(2 * HOUR)
    assert (q.replicas, q.min_replicas, q.max_replicas, q.max_nodes) == (2, 2, 4, 1)
    assert q.is_resizable
    assert (r.replicas, r.min_replicas, r.max_replicas) == (2, 0, None)
    assert not r.is_resizable
    # After the shrink to 1 GPU at 1 h: 2 h of work left at rate 1/2, after a 20 s restart.
    a2 = seen[2]["a"]
    assert (a2.replicas, a2.placement) == (2, {"n0": 1})
    assert a2.expected_runtime_s == pytest.approx(RESTART_S + 4 * HOUR)
    assert a2.last_moved_at == pytest.approx(HOUR)


def test_a_block_resize_becomes_a_rescale_a_service_resize_stays_a_resize() -> None:
    svc = Service(id="s", hourly_demand=(1.0,), gpus_per_replica=2)
    wl = workload(
        [elastic("a", gpus=2, hours=4, max_gpus=4)], nodes=(("n0", 4), ("n1", 4)), services=[svc]
    )
    sim = Simulation(wl, ScriptedPlanner(lambda sim: []))
    why = Reason(code=ReasonCode.grown)
    plan = Plan(
        policy="shaper",
        actions=[
            Action(
                kind=ActionKind.resize,
                job_id="a",
                from_placement={"n0": 2},
                to_placement={"n0": 2, "n1": 2},
                replicas=4,
                reason=why,
            ),
            Action(
                kind=ActionKind.resize,
                job_id="s",
                to_placement={"n1": 4},
                replicas=2,
                reason=Reason(code=ReasonCode.resized_to_demand),
            ),
        ],
    )
    assert to_actions(plan, sim) == [
        Rescale("a", {"n0": 2, "n1": 2}, "grown"),
        Resize("s", {"n1": 2}, "resized_to_demand"),
    ]


def test_a_migration_onto_gpus_a_rescale_left_waits_for_its_checkpoint_dump() -> None:
    # e (100 GB image: a 100 s dump) shrinks from 2 GPUs to 1 on n0; m (10 GB) migrates
    # onto n0 in the same plan. The rescale lands first and keeps GPU 0; m takes GPU 1,
    # still dumping e's checkpoint, and GPU 2, so it computes only once the dump is done.
    e = replace(
        job("e", gpus=2, hours=4, checkpointable=True, image_gb=100), min_gpus=1, max_gpus=4
    )
    m = job("m", gpus=2, hours=4, checkpointable=True)
    wl = workload([e, m], nodes=(("n0", 4), ("n1", 4)))

    def script(sim: Simulation):
        if sim.now == 0:
            return [Start("e", {"n0": 2}), Start("m", {"n1": 2})]
        if round(sim.now / HOUR, 6) == 1:
            return [Rescale("e", {"n0": 1}), Migrate("m", {"n0": 2})]
        return []

    sim = Simulation(wl, ScriptedPlanner(script), check_invariants=True).run()
    dump = wl.transfer.checkpoint_seconds(100)
    assert dump > RESTART_S  # the wait is the dump's, not m's own restart
    assert sim.jobs["m"].end_time == pytest.approx(4 * HOUR + dump)
    assert sim.check_ledger() == pytest.approx(0.0, abs=TOLERANCE_GPU_S)
