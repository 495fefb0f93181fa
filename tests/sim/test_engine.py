"""The event engine with scripted actions: every figure here is worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.actions import Migrate, Preempt, Resize, Start
from sim.engine import JobStatus, Simulation
from sim.metrics import summarize
from sim.workload import GpuModel, NodeEvent, Service, Transfer

from .builders import HOUR, ScriptedPlanner, at, job, workload


def run(wl, schedule, **kwargs) -> Simulation:
    planner = ScriptedPlanner(at(schedule))
    return Simulation(wl, planner, check_invariants=True, **kwargs).run()


def test_start_and_complete_accounting() -> None:
    # 4 GPUs for 10 h; a (2 GPUs, 3 h) starts at 0, b (4 GPUs, 2 h) starts at 3 h when a ends.
    wl = workload([job("a", gpus=2, hours=3), job("b", gpus=4, hours=2, at_h=1)])
    sim = run(wl, {0: [Start("a", {"n0": 2})], 3: [Start("b", {"n0": 4})]})
    m = summarize(sim).metrics
    assert sim.jobs["a"].end_time == pytest.approx(3 * HOUR)
    assert sim.jobs["b"].end_time == pytest.approx(5 * HOUR)
    # busy GPU-hours 2*3 + 4*2 = 14 of 40
    assert m["utilization"] == pytest.approx(14 / 40)
    assert m["useful_gpu_hours"] == pytest.approx(14)
    assert m["jobs_completed"] == 2
    # JCT: a 3 h, b 5 - 1 = 4 h; queue wait: a 0, b 2 h
    assert m["jct_mean_h"] == pytest.approx(3.5)
    assert m["queue_wait_mean_h"] == pytest.approx(1.0)
    assert m["weighted_output"] == pytest.approx(14)


def test_preempt_loses_work_since_last_periodic_checkpoint() -> None:
    # Not checkpointable, checkpoints every hour; preempted at 2.5 h: 0.5 h × 2 GPUs lost.
    wl = workload([job("a", gpus=2, hours=4, checkpoint_interval_h=1.0)], horizon_h=12)
    sim = run(
        wl,
        {0: [Start("a", {"n0": 2})], 2.5: [Preempt("a")], 3: [Start("a", {"n0": 2})]},
    )
    state = sim.jobs["a"]
    m = summarize(sim).metrics
    assert m["lost_gpu_hours"] == pytest.approx(1.0)
    # Restart from 2 h of progress: restore 10 GiB at 1 GiB/s = 10 s, then 2 h left.
    assert state.end_time == pytest.approx(3 * HOUR + 10 + 2 * HOUR)
    assert m["preemptions"] == 1
    assert m["useful_gpu_hours"] == pytest.approx(8)


def test_preempt_without_any_checkpoint_loses_everything() -> None:
    wl = workload([job("a", gpus=1, hours=4)], horizon_h=5)
    sim = run(wl, {0: [Start("a", {"n0": 1})], 3: [Preempt("a")]})
    m = summarize(sim).metrics
    assert m["lost_gpu_hours"] == pytest.approx(3)
    assert m["useful_gpu_hours"] == 0
    assert sim.jobs["a"].status is JobStatus.queued


def test_checkpointed_preemption_keeps_progress_and_pays_checkpoint() -> None:
    wl = workload([job("a", gpus=2, hours=4, checkpointable=True)], horizon_h=12)
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 2})],
            1: [Preempt("a", checkpoint=True)],
            2: [Start("a", {"n0": 2})],
        },
    )
    m = summarize(sim).metrics
    assert m["lost_gpu_hours"] == 0
    # 1 h done, 3 h left after a 10 s restore from 2 h.
    assert sim.jobs["a"].end_time == pytest.approx(2 * HOUR + 10 + 3 * HOUR)
    # checkpoint 10 s + restore 10 s on 2 GPUs
    assert m["checkpoint_gpu_hours"] == pytest.approx(2 * 20 / HOUR)


def test_migration_keeps_progress_and_pays_checkpoint_transfer_restore() -> None:
    transfer = Transfer(bandwidth_mib_per_s=1024.0, overhead_s=30.0)
    wl = workload(
        [job("a", gpus=2, hours=4, checkpointable=True, image_gb=20)],
        nodes=(("n0", 4), ("n1", 4)),
        transfer=transfer,
    )
    sim = run(wl, {0: [Start("a", {"n0": 2})], 1: [Migrate("a", {"n1": 2})]})
    # migration = 30 s overhead + 2 × 20 s = 70 s; completion delayed by that.
    assert sim.jobs["a"].end_time == pytest.approx(4 * HOUR + 70)
    m = summarize(sim).metrics
    assert m["migrations"] == 1
    # The target's 2 GPUs wait 70 s (checkpoint + restore) and the source's 2 GPUs dump the
    # checkpoint for 35 s before anyone can use them: 2 × 70 + 2 × 35 GPU-seconds.
    assert m["migration_gpu_hours"] == pytest.approx((2 * 70 + 2 * 35) / HOUR)
    assert m["allocated_block_gpu_hours"] == pytest.approx(8 + 210 / HOUR)
    assert m["productive_gpu_hours"] == pytest.approx(8)
    assert m["unaccounted_gpu_hours"] == pytest.approx(0, abs=1e-9)
    assert sim.jobs["a"].placement == {}
    assert m["useful_gpu_hours"] == pytest.approx(8)


def test_non_checkpointable_job_cannot_migrate() -> None:
    wl = workload([job("a", gpus=2, hours=4)], nodes=(("n0", 4), ("n1", 4)))
    sim = run(wl, {0: [Start("a", {"n0": 2})], 1: [Migrate("a", {"n1": 2})]})
    assert sim.counters.rejected_actions == 1
    assert sim.jobs["a"].end_time == pytest.approx(4 * HOUR)


def test_illegal_actions_are_rejected_not_applied() -> None:
    wl = workload([job("a", gpus=3, hours=1), job("b", gpus=2, hours=1)])
    sim = run(
        wl,
        {
            0: [
                Start("a", {"n0": 3}),
                Start("b", {"n0": 2}),  # only 1 GPU left
                Start("zzz", {"n0": 1}),  # unknown job
                Start("a", {"n0": 3}),  # already running
                Preempt("b"),  # not running
            ]
        },
    )
    assert sim.counters.rejected_actions == 4
    assert sim.jobs["b"].status is JobStatus.queued


def test_wrong_gpu_model_is_rejected() -> None:
    wl = workload(
        [job("a", gpus=1, hours=1, models=("H100",))],
        extra_models=(GpuModel(name="H100", speed=2.0),),
    )
    sim = run(wl, {0: [Start("a", {"n0": 1})]})
    assert sim.counters.rejected_actions == 1


def test_faster_model_finishes_sooner() -> None:
    wl = workload(
        [job("a", gpus=1, hours=4)],
        extra_models=(GpuModel(name="H100", speed=2.0),),
        nodes=(("n0", 4), ("fast", 4)),
        node_models={"fast": "H100"},
    )
    sim = run(wl, {0: [Start("a", {"fast": 1})]})
    assert sim.jobs["a"].end_time == pytest.approx(2 * HOUR)


def test_a_job_s_own_speed_on_a_model_beats_the_model_s() -> None:
    # A job type 3x faster on V100 than on K80, on a cluster whose K80 has the mean speed
    # 0.5: 3 h of reference work takes 3 h on a V100 and 9 h on a K80 (not the 6 h the
    # model's speed gives); a job without its own speeds keeps the model's 6 h.
    own = (("V100", 1.0), ("K80", 1 / 3))
    jobs = [replace(job(name, gpus=1, hours=3), speeds=own) for name in ("on-v100", "on-k80")] + [
        job("plain", gpus=1, hours=3),
        replace(job("gang", gpus=2, hours=3), speeds=own),
    ]
    wl = workload(
        jobs,
        model="V100",
        extra_models=(GpuModel(name="K80", speed=0.5),),
        nodes=(("v", 4), ("k", 4)),
        node_models={"k": "K80"},
        horizon_h=12,
    )
    sim = run(
        wl,
        {
            0: [
                Start("on-v100", {"v": 1}),
                Start("on-k80", {"k": 1}),
                Start("plain", {"k": 1}),
                # A gang across both models runs at its slowest GPU: the K80, at 1/3.
                Start("gang", {"v": 1, "k": 1}),
            ]
        },
    )
    ends = {name: sim.jobs[name].end_time for name in ("on-v100", "on-k80", "plain", "gang")}
    assert ends == pytest.approx(
        {"on-v100": 3 * HOUR, "on-k80": 9 * HOUR, "plain": 6 * HOUR, "gang": 9 * HOUR}
    )
    assert ends["on-k80"] / ends["on-v100"] == pytest.approx(3.0)


def test_speeds_on_unknown_models_or_not_positive_are_refused() -> None:
    unknown = workload([replace(job("a", gpus=1, hours=1), speeds=(("H200", 2.0),))])
    with pytest.raises(ValueError, match=r"job a: speeds on unknown GPU models \['H200'\]"):
        unknown.validate()
    zero = workload([replace(job("a", gpus=1, hours=1), speeds=(("A100", 0.0),))])
    with pytest.raises(ValueError, match="job a: speeds must be positive"):
        zero.validate()


def test_node_failure_evicts_and_loses_unsaved_work() -> None:
    wl = workload(
        [job("a", gpus=4, hours=5, checkpoint_interval_h=2.0)],
        events=[NodeEvent(time=3 * HOUR, node="n0", kind="fail")],
        horizon_h=6,
    )
    sim = run(wl, {0: [Start("a", {"n0": 4})]})
    m = summarize(sim).metrics
    assert m["lost_gpu_hours"] == pytest.approx(4)  # 1 h since the 2 h checkpoint × 4 GPUs
    assert m["failure_evictions"] == 1 and m["preemptions"] == 0
    # Available GPU-time excludes the down node: 4 GPUs × 3 h.
    assert m["available_gpu_hours"] == pytest.approx(12)
    assert sim.jobs["a"].status is JobStatus.queued


def test_drained_node_accepts_nothing_new_but_keeps_running_work() -> None:
    wl = workload(
        [job("a", gpus=2, hours=3), job("b", gpus=2, hours=1, at_h=1)],
        events=[NodeEvent(time=0.5 * HOUR, node="n0", kind="drain")],
    )
    sim = run(wl, {0: [Start("a", {"n0": 2})], 1: [Start("b", {"n0": 2})]})
    assert sim.jobs["a"].status is JobStatus.done
    assert sim.jobs["b"].status is JobStatus.queued
    assert sim.counters.rejected_actions == 1


def test_service_demand_served_and_unmet() -> None:
    # Demand 2 replicas in hour 0, 4 in hour 1; one replica per GPU; resized to 2 then 3.
    chat = Service(id="chat", hourly_demand=(2, 4), priority=5)
    wl = workload([], services=[chat], horizon_h=2)
    sim = run(wl, {0: [Resize("chat", {"n0": 2})], 1: [Resize("chat", {"n0": 3})]})
    m = summarize(sim).metrics
    assert m["demand_replica_hours"] == pytest.approx(6)
    assert m["unmet_demand_replica_hours"] == pytest.approx(1)
    assert m["sla_violations"] == 1
    assert m["utilization"] == pytest.approx(5 / 8)


def test_reserved_replicas_beyond_demand_are_allocated_but_not_busy() -> None:
    chat = Service(id="chat", hourly_demand=(1, 3), priority=5)
    wl = workload([], services=[chat], horizon_h=2)
    sim = run(wl, {0: [Resize("chat", {"n0": 3})]})
    m = summarize(sim).metrics
    assert m["allocated_utilization"] == pytest.approx(6 / 8)
    assert m["utilization"] == pytest.approx(4 / 8)
    assert m["unmet_demand_replica_hours"] == 0


def test_cadence_and_event_replans() -> None:
    wl = workload([job("a", gpus=1, hours=0.25, at_h=0.1)], horizon_h=1, replan_min=30)
    planner = ScriptedPlanner(lambda sim: [Start("a", {"n0": 1})] if sim.queue else [])
    Simulation(wl, planner, check_invariants=True).run()
    hours = [round(t / HOUR, 4) for t in planner.calls]
    # cadence at 0, 0.5, 1.0 (the horizon is not planned); arrival at 0.1; completion 0.35
    assert hours == [0.0, 0.1, 0.35, 0.5]


def test_min_replan_gap_coalesces_events() -> None:
    jobs = [job(f"j{i}", gpus=1, hours=5, at_h=0.01 * i) for i in range(1, 6)]
    wl = workload(jobs, horizon_h=2, replan_min=0)
    planner = ScriptedPlanner(lambda sim: [])
    Simulation(wl, planner, min_replan_gap=HOUR).run()
    assert [round(t / HOUR, 4) for t in planner.calls] == [0.01, 1.01]


def test_a_simulation_runs_once() -> None:
    sim = run(workload([]), {})
    with pytest.raises(RuntimeError):
        sim.run()


def test_a_job_that_takes_gpus_still_dumping_waits_and_the_wait_is_the_dump_s_cost() -> None:
    # a (checkpointable, 2 GPUs) is preempted at 1 h; its 35 s dump keeps n0's GPUs busy.
    # b starts on them at once: it waits the 35 s, charged to checkpointing, not to b's work.
    transfer = Transfer(bandwidth_mib_per_s=1024.0, overhead_s=30.0)
    wl = workload(
        [job("a", gpus=2, hours=2, checkpointable=True, image_gb=20), job("b", gpus=2, hours=1)],
        nodes=(("n0", 2),),
        transfer=transfer,
        horizon_h=1,
    )
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 2})],
            1: [Preempt("a"), Start("b", {"n0": 2})],
            2.5: [Start("a", {"n0": 2})],
        },
    )
    assert sim.jobs["b"].end_time == pytest.approx(2 * HOUR + 35)
    assert sim.jobs["a"].end_time == pytest.approx(3.5 * HOUR + 35)
    m = summarize(sim).metrics
    # b's wait (2 × 35) and, when a comes back after b, its restore (2 × 35).
    assert sim.jobs["b"].ledger.checkpoint == pytest.approx(70)
    assert m["checkpoint_gpu_hours"] == pytest.approx(140 / HOUR)
    assert m["productive_gpu_hours"] == pytest.approx(2 * 2 + 2 * 1)
    assert m["unaccounted_gpu_hours"] == pytest.approx(0, abs=1e-9)


def test_free_gpus_dumping_a_checkpoint_are_allocated_to_the_job_that_left() -> None:
    transfer = Transfer(bandwidth_mib_per_s=1024.0, overhead_s=30.0)
    wl = workload(
        [job("a", gpus=2, hours=2, checkpointable=True, image_gb=20)],
        nodes=(("n0", 2),),
        transfer=transfer,
        horizon_h=3,
    )
    sim = run(wl, {0: [Start("a", {"n0": 2})], 1: [Preempt("a")]}, drain=False)
    m = summarize(sim).metrics
    assert sim.jobs["a"].ledger.checkpoint == pytest.approx(70)
    assert m["allocated_block_gpu_hours"] == pytest.approx(2 + 70 / HOUR)
    assert m["utilization"] == pytest.approx((2 * HOUR + 70) / (2 * 3 * HOUR))


def test_lost_work_on_a_slower_model_is_counted_in_held_gpu_time() -> None:
    # Half-speed GPUs: 1 h of reference work takes 2 h; a failure at 3 h loses 1 h held.
    wl = workload(
        [job("a", gpus=1, hours=4, checkpoint_interval_h=1.0)],
        extra_models=(GpuModel(name="T4", speed=0.5),),
        nodes=(("slow", 1),),
        node_models={"slow": "T4"},
        events=[NodeEvent(time=3 * HOUR, node="slow", kind="fail")],
        horizon_h=4,
    )
    sim = run(wl, {0: [Start("a", {"slow": 1})]}, drain=False)
    m = summarize(sim).metrics
    assert m["lost_gpu_hours"] == pytest.approx(1)
    assert m["productive_gpu_hours"] == pytest.approx(2)  # 1 h of work, checkpointed
    assert m["useful_gpu_hours"] == pytest.approx(1)  # reference work


def test_run_goes_on_until_the_queue_drains_and_censors_nothing() -> None:
    # 2 GPUs, horizon 2 h; a (2 GPUs, 3 h) then b (2 GPUs, 2 h): b ends at 5 h.
    wl = workload(
        [job("a", gpus=2, hours=3), job("b", gpus=2, hours=2, at_h=1)],
        nodes=(("n0", 2),),
        horizon_h=2,
    )
    sim = run(wl, {0: [Start("a", {"n0": 2})], 3: [Start("b", {"n0": 2})]})
    assert sim.drained and sim.run_end == pytest.approx(5 * HOUR)
    m = summarize(sim).metrics
    assert m["jct_censored_jobs"] == 0
    assert m["jct_mean_h"] == pytest.approx((3 + 4) / 2)
    assert m["makespan_h"] == pytest.approx(5)
    assert m["queue_wait_max_h"] == pytest.approx(2)
    # The window's figures stop at the horizon: 2 GPUs × 2 h busy, a's 2 h not kept
    # (it cannot be checkpointed), nothing done by then.
    assert m["utilization"] == pytest.approx(1.0)
    assert m["weighted_output"] == pytest.approx(0)
    assert m["jobs_completed_in_window"] == 0 and m["jobs_completed"] == 2


def test_unfinished_jobs_are_censored_at_the_end_of_the_run() -> None:
    wl = workload(
        [job("a", gpus=2, hours=3), job("b", gpus=2, hours=2, at_h=1)],
        nodes=(("n0", 2),),
        horizon_h=2,
    )
    sim = run(wl, {0: [Start("a", {"n0": 2})]}, drain=False)
    m = summarize(sim).metrics
    assert not sim.drained and m["jct_censored_jobs"] == 2
    # Lower bounds: a has run 2 h, b waited 1 h.
    assert m["jct_mean_h"] == pytest.approx(1.5)
    assert m["makespan_h"] == pytest.approx(2)
    assert m["completed_share"] == 0
    assert m["in_flight_gpu_hours"] == pytest.approx(4)  # a's progress, not checkpointable


def test_a_drain_that_cannot_finish_stops_at_the_cap_and_says_so() -> None:
    wl = workload([job("a", gpus=1, hours=1)], nodes=(("n0", 1),), horizon_h=1)
    sim = run(wl, {}, drain_cap=5 * HOUR)  # nobody ever starts a
    m = summarize(sim).metrics
    assert m["drain_cap_hit"] == 1 and m["run_end_h"] == pytest.approx(5)
    assert m["queue_wait_max_h"] == pytest.approx(5)


def test_no_job_gives_no_completion_figure() -> None:
    wl = workload([], horizon_h=1)
    m = summarize(run(wl, {})).metrics
    assert m["jct_mean_h"] is None and m["makespan_h"] is None and m["completed_share"] is None


def test_a_job_that_fits_only_the_free_gpus_taken_together_counts_as_fragmentation_blocked() -> (
    None
):
    # Two 4-GPU nodes with 2 GPUs held on each: 4 GPUs free, but no node has 4.
    wl = workload(
        [
            job("a", gpus=2, hours=5),
            job("b", gpus=2, hours=5),
            job("gang", gpus=4, hours=1, at_h=0.25),
        ],
        nodes=(("n0", 4), ("n1", 4)),
        horizon_h=1,
    )
    sim = run(wl, {0: [Start("a", {"n0": 2}), Start("b", {"n1": 2})]}, drain=False)
    m = summarize(sim).metrics
    # Re-plans at 0 (a and b fit), at 0.25 (the gang arrives: blocked), at 0.5 (blocked).
    assert sim.counters.replans == 3
    assert sim.counters.fragmentation_blocked_replans == 2
    assert m["fragmentation_blocked_share"] == pytest.approx(2 / sim.counters.replans)
