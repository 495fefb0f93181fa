"""The simulated cluster (`sim` kind) and its in-process agents and connector."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors import registry
from connectors.base import ConnectorError
from connectors.sim import ServiceSpec, SimCluster, SimExecutors, SiteSpec, diurnal
from wire.telemetry import JobKind, JobReport, JobShape, JobState, SchedulerKind

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = SiteSpec(
    name="lab",
    nodes=(("a", "H100", 8), ("b", "H100", 8)),
    teams=("research",),
    kinds=(JobKind.training,),
    arrivals_per_hour=0,
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


# Two 4-GPU nodes and one service of up to 6 one-GPU replicas, no arrivals.
SERVICE_SPEC = SiteSpec(
    name="svc",
    nodes=(("a", "L40S", 4), ("b", "L40S", 4)),
    teams=("serving",),
    kinds=(JobKind.batch_inference,),
    services=(ServiceSpec("chat", 6, 1),),
    arrivals_per_hour=0,
)


def _cluster(spec: SiteSpec = SPEC) -> tuple[SimCluster, Clock]:
    clock = Clock()
    return SimCluster(spec, start=T0, seed=1, clock=clock), clock


def _submit(
    cluster: SimCluster, job_id: str, gpus: int, minutes: int, *, checkpointable: bool = True
) -> None:
    cluster.submit(
        JobReport(
            external_id=job_id,
            gpus_requested=gpus,
            checkpointable=checkpointable,
            submit_time=cluster.now + timedelta(seconds=len(cluster.jobs)),
        ),
        timedelta(minutes=minutes),
    )


def _states(cluster: SimCluster) -> dict[str, tuple[str, list[str]]]:
    return {
        job.external_id: (job.state.value, sorted(a.node for a in job.allocations))
        for job in cluster.read_state().jobs
    }


def test_fifo_blocks_behind_a_job_that_does_not_fit_and_jobs_finish_on_time() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "six", 6, 30)
    _submit(cluster, "big", 8, 60)  # does not fit next to `six` on a; fits on b
    _submit(cluster, "huge", 16, 60)  # needs both nodes whole: blocks the queue
    _submit(cluster, "one", 1, 60)  # would fit, but FIFO does not backfill
    clock.now = T0 + timedelta(minutes=1)

    assert _states(cluster) == {
        "six": ("running", ["a"]),
        "big": ("running", ["b"]),
        "huge": ("pending", []),
        "one": ("pending", []),
    }
    clock.now = T0 + timedelta(minutes=32)  # `six` is done after 30 minutes of work
    states = _states(cluster)
    assert states["six"] == ("finished", [])
    assert states["one"] == ("pending", [])  # still behind `huge`
    finished = next(j for j in cluster.read_state().jobs if j.external_id == "six")
    assert finished.end_time == T0 + timedelta(minutes=30)


def test_a_start_step_places_a_job_ahead_of_the_fifo_queue() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "six", 6, 30)
    _submit(cluster, "huge", 16, 60)
    _submit(cluster, "one", 1, 60)
    clock.now = T0 + timedelta(minutes=1)
    cluster.read_state()

    cluster.release("one")  # what the connector executor does for `start`

    assert _states(cluster)["one"] == ("running", ["a"])


def test_checkpoint_and_restore_move_a_job_with_its_progress() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "job", 4, 60)
    clock.now = T0 + timedelta(minutes=20)
    cluster.read_state()
    assert _states(cluster)["job"] == ("running", ["a"])

    done = cluster.take_off("job", "a")
    cluster.put_on("job", "b", done)
    clock.now = T0 + timedelta(minutes=61)

    assert done == timedelta(minutes=20)
    assert _states(cluster)["job"] == ("finished", [])  # 20 + 41 minutes ≥ 60
    with pytest.raises(ConnectorError, match="does not run on a alone"):
        cluster.take_off("job", "a")


def test_a_requeue_without_checkpoint_loses_the_work_and_can_pin_the_job() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "job", 4, 60, checkpointable=False)
    clock.now = T0 + timedelta(minutes=30)
    cluster.read_state()

    cluster.requeue("job", nodes=["b"])

    assert _states(cluster)["job"] == ("running", ["b"])
    assert cluster.jobs["job"].done == timedelta(0)
    assert cluster.read_state().jobs[0].restart_count == 1


def test_services_follow_demand_until_resized_and_refuse_out_of_range() -> None:
    cluster, clock = _cluster(SERVICE_SPEC)
    service = next(j for j in cluster.read_state().jobs if j.external_id == "chat")
    assert service.shape is JobShape.elastic and service.replicas == diurnal(6, T0)
    assert sum(len(a.gpu_indices) for a in service.allocations) == service.replicas

    cluster.resize("chat", replicas=2)
    clock.now = T0 + timedelta(hours=2)
    resized = next(j for j in cluster.read_state().jobs if j.external_id == "chat")
    assert resized.replicas == 2 and sum(len(a.gpu_indices) for a in resized.allocations) == 2
    with pytest.raises(ConnectorError, match="outside 1..6"):
        cluster.resize("chat", replicas=9)


def test_a_service_shrinks_off_the_nodes_a_resize_step_names(tmp_path: Path) -> None:
    """``args.leave`` takes the service's replicas off the named nodes (the others stay
    where they are), through the connector executor; a resent step changes nothing; a node
    without that many replicas, or a count that does not add up, is refused."""
    cluster, _ = _cluster(SERVICE_SPEC)
    chat = cluster.jobs["chat"]
    chat.resized = True
    chat.placement = {"a": [0, 1], "b": [2, 3]}
    chat.report = chat.report.model_copy(update={"replicas": 4})
    assert next(j for j in cluster.read_state().jobs if j.external_id == "chat").replicas_movable
    executors = SimExecutors(cluster, state_dir=tmp_path)
    workload = {"workload_id": "chat"}

    def resize(generation: int, **args: Any) -> dict[str, Any]:
        queue, step = _step("resize", "connector.svc", generation, **args)
        return executors.handle(queue, {**step, **workload})

    done = resize(1, replicas=3, leave={"a": 1})
    assert done["ok"] and "off a (1)" in done["result"]["summary"], done
    assert done["result"]["leave"] == {"a": 1}
    assert chat.placement == {"a": [0], "b": [2, 3]} and chat.report.replicas == 3
    assert resize(1, replicas=3, leave={"a": 1})["outcome"] == "duplicate"
    refused = resize(2, replicas=1, leave={"a": 2})
    assert not refused["ok"] and "has 1 replicas on a, not the 2" in refused["error"], refused
    mismatched = resize(3, replicas=1, leave={"b": 1})
    assert not mismatched["ok"] and "leaves 2, not 1" in mismatched["error"], mismatched
    assert chat.placement == {"a": [0], "b": [2, 3]}  # nothing changed by the refusals
    malformed = resize(4, replicas=2, leave={"a": 0})
    assert malformed["outcome"] == "refused" and "args.leave" in malformed["error"], malformed


def test_a_shrink_off_named_nodes_is_confirmed_by_the_gpus_left_there(tmp_path: Path) -> None:
    """The resize's confirm (``args.gpus_at_most``) reads the GPUs the service holds on each
    node it shrinks off: a service at the size asked for but still on the node (another's
    shrink, which a resent ``resize_off`` cannot tell from its own) is "not yet"."""
    cluster, _ = _cluster(SERVICE_SPEC)
    chat = cluster.jobs["chat"]
    chat.resized = True
    chat.placement = {"a": [0, 1], "b": [2, 3]}
    chat.report = chat.report.model_copy(update={"replicas": 4})
    executors = SimExecutors(cluster, state_dir=tmp_path)

    def step(name: str, generation: int, **args: Any) -> dict[str, Any]:
        queue, body = _step(name, "connector.svc", generation, **args)
        return executors.handle(queue, {**body, "workload_id": "chat"})

    confirm = {"expect": "running"}  # as app.actions.messages sends it, with gpus_at_most
    assert step("resize", 1, replicas=3, leave={"a": 1})["ok"]
    done = step("confirm", 1, **confirm, gpus_at_most={"a": 1})
    assert done["ok"] and "(GPUs a: 1)" in done["result"]["summary"], done
    # Someone else shrank it to 3 off b: the plan's node a still holds 2 of its GPUs.
    chat.placement = {"a": [0, 1], "b": [2]}
    waiting = step("confirm", 2, **confirm, gpus_at_most={"a": 1})
    assert not waiting["ok"] and waiting["retryable"], waiting
    assert "(GPUs a: 2)" in waiting["error"] and "at most 1 GPU(s) on a" in waiting["error"]
    malformed = step("confirm", 3, **confirm, gpus_at_most={"a": -1})
    assert malformed["outcome"] == "refused" and "args.gpus_at_most" in malformed["error"]


def test_arrivals_are_seeded() -> None:
    spec = SiteSpec(name="busy", nodes=SPEC.nodes, teams=("t",), kinds=(JobKind.hpc,))
    runs = []
    for _ in range(2):
        cluster, clock = _cluster(spec)
        clock.now = T0 + timedelta(hours=5)
        runs.append(sorted((j.external_id, j.gpus_requested) for j in cluster.read_state().jobs))
    assert runs[0] == runs[1] and len(runs[0]) >= 10


def _step(name: str, queue: str, generation: int, **args: Any) -> tuple[str, dict[str, Any]]:
    return queue, {
        "action_id": 1,
        "key": f"k:{name}:{queue}:{generation}",
        "step": name,
        "phase": "forward",
        "workload_id": "job",
        "generation": generation,
        "args": args,
        "reply_task": "r",
        "reply_queue": "control",
    }


def test_simulated_agents_migrate_a_job_and_keep_the_fencing_rules(tmp_path: Path) -> None:
    cluster, clock = _cluster()
    _submit(cluster, "job", 4, 60)
    clock.now = T0 + timedelta(minutes=10)
    cluster.read_state()
    executors = SimExecutors(cluster, state_dir=tmp_path)

    checkpoint = executors.handle(*_step("checkpoint", "agent.lab.a", 1))
    assert checkpoint["ok"], checkpoint
    image = checkpoint["result"]["image"]
    restore = executors.handle(*_step("restore", "agent.lab.b", 1, image=image))
    assert restore["ok"], restore.get("error")
    assert executors.handle(*_step("confirm", "agent.lab.b", 1))["ok"]
    assert _states(cluster)["job"] == ("running", ["b"])
    assert cluster.jobs["job"].done == timedelta(minutes=10)

    again = executors.handle(*_step("restore", "agent.lab.b", 1, image=image))
    assert again["outcome"] == "duplicate"
    # The saga that took the job away from a cannot bring it back there.
    late = executors.handle(*_step("restore", "agent.lab.a", 1, image=image))
    assert late["outcome"] == "refused" and "stale" in late["error"]
    stale_queue, stale = _step("checkpoint", "agent.lab.b", 0)
    refused = executors.handle(stale_queue, stale)
    assert refused["outcome"] == "refused" and "stale" in refused["error"]
    assert _states(cluster)["job"] == ("running", ["b"])  # never on two nodes


def test_simulated_connector_steps_go_through_the_connector_executor(tmp_path: Path) -> None:
    cluster, clock = _cluster()
    _submit(cluster, "job", 4, 60)
    clock.now = T0 + timedelta(minutes=1)
    cluster.read_state()
    executors = SimExecutors(cluster, state_dir=tmp_path)

    report = executors.handle(*_step("requeue", "connector.lab", 1, nodes=["b"]))

    assert report["ok"] and report["executor"] == "connector.lab", report
    assert _states(cluster)["job"] == ("running", ["b"])
    assert executors.handle(*_step("requeue", "connector.lab", 1, nodes=["b"]))["outcome"] == (
        "duplicate"
    )
    assert cluster.read_state().jobs[0].state is JobState.running


def test_the_sim_kind_is_registered_and_checks_its_options() -> None:
    cluster = registry.create(SchedulerKind.sim, cluster="demo", nodes=2, gpus_per_node=4)
    assert [n.name for n in cluster.read_state().nodes] == ["demo-n01", "demo-n02"]
    with pytest.raises(TypeError):
        registry.create(SchedulerKind.sim, cluster="demo", colour="red")


def test_a_reservation_keeps_freed_gpus_for_its_job_and_is_refused_on_a_stale_view() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "half", 4, 60)
    _submit(cluster, "other", 8, 60)  # fills b
    cluster.submit(
        JobReport(external_id="big", gpus_requested=8, submit_time=T0), timedelta(hours=1)
    )
    assert _states(cluster)["big"] == ("pending", [])
    with pytest.raises(ConnectorError, match="held by half"):
        cluster.reserve("big", gpus={"a": 8}, ttl_s=600, counts_on=[])
    cluster.reserve("big", gpus={"a": 8}, ttl_s=600, counts_on=["half"])
    # A job that FIFO puts first cannot take a's free GPUs, nor those "half" leaves.
    cluster.submit(
        JobReport(external_id="rival", gpus_requested=2, submit_time=T0 - timedelta(hours=1)),
        timedelta(hours=1),
    )
    assert _states(cluster)["rival"] == ("pending", [])
    cluster.requeue("half", nodes=["b"], hold=True)
    assert _states(cluster)["half"] == ("pending", [])  # held: it does not take them back
    assert _states(cluster)["rival"] == ("pending", [])
    cluster.start("big", nodes=["a"])
    assert _states(cluster)["big"] == ("running", ["a"])
    assert cluster.reservations == {}  # consumed
    clock.now = T0 + timedelta(minutes=1)
    cluster.unreserve("big")  # giving back what is gone already is fine


@pytest.mark.parametrize("reserved", [False, True], ids=["control", "reserved"])
def test_a_service_grows_into_gpus_reserved_for_it_and_the_growth_spends_the_hold(
    reserved: bool,
) -> None:
    cluster, _clock = _cluster(SERVICE_SPEC)
    cluster.resize("chat", replicas=1)
    (home,) = _states(cluster)["chat"][1]
    other = "b" if home == "a" else "a"
    _submit(cluster, "beside", 3, 600)  # fills the service's node
    _submit(cluster, "freed", 4, 600)  # fills the other one, then gives way to the service
    assert _states(cluster)["freed"] == ("running", [other])
    _submit(cluster, "rival", 2, 600)  # FIFO would give it what "freed" leaves
    if reserved:
        cluster.reserve("chat", gpus={other: 3}, ttl_s=600, counts_on=["freed", "chat"])

    cluster.cancel("freed")

    if not reserved:
        assert _states(cluster)["rival"] == ("running", [other])
        return
    assert _states(cluster)["rival"] == ("pending", [])  # 1 GPU is not held, 2 are wanted
    cluster.resize("chat", replicas=4)
    assert _states(cluster)["chat"] == ("running", [home, other])
    assert cluster.reservations == {}


def test_elastic_training_jobs_arrive_run_at_their_size_and_are_resized() -> None:
    """``elastic_share``: checkpointable training jobs of 2+ GPUs that may run on half to
    twice the GPUs they ask (1-GPU replicas), at a speed in proportion to what they hold,
    drawn from a stream of their own: the arrivals are those of ``elastic_share=0``."""
    spec = SiteSpec(
        name="el", nodes=SPEC.nodes, teams=("t",), kinds=(JobKind.training,),
        arrivals_per_hour=20, job_gpus=(2, 4), checkpointable_share=1.0,
    )  # fmt: skip
    plain, _ = _cluster(spec)
    elastic, _ = _cluster(SiteSpec(**{**spec.__dict__, "elastic_share": 1.0}))
    for cluster in (plain, elastic):
        cluster.advance_to(T0 + timedelta(minutes=30))
    assert list(plain.jobs) == list(elastic.jobs)
    reports = [job.report for job in elastic.jobs.values()]
    assert reports and all(
        (r.min_replicas, r.max_replicas, r.replicas, r.gang_size)
        == (r.gpus_requested // 2, 2 * r.gpus_requested, r.gpus_requested, r.gpus_requested)
        for r in reports
    )
    assert all(job.report.max_replicas == 0 for job in plain.jobs.values())

    cluster, clock = _cluster()
    job_id = "e"
    cluster.submit(
        JobReport(external_id=job_id, gpus_requested=4, submit_time=T0), timedelta(hours=2)
    )
    job = cluster.jobs[job_id]
    job.asked = 4
    job.report = job.report.model_copy(
        update={"gang_size": 4, "min_replicas": 2, "max_replicas": 8, "replicas": 4}
    )
    cluster.requeue(job_id, hold=True)  # it started at once: waiting again, held
    cluster.start(job_id, nodes=["a"], replicas=2)  # started smaller than asked
    assert _states(cluster)[job_id] == ("running", ["a"])
    assert cluster.jobs[job_id].report.gpus_requested == 2
    clock.now = T0 + timedelta(hours=1)
    cluster.read_state()
    assert cluster.jobs[job_id].done == timedelta(minutes=30)  # half the GPUs, half the pace
    cluster.resize_job(job_id, nodes=["a", "b"], replicas=8)  # grows, loses a checkpoint's work
    held = {n: len(i) for n, i in cluster.jobs[job_id].placement.items()}
    assert sum(held.values()) == 8 and cluster.jobs[job_id].done == timedelta(minutes=28)
    assert cluster.jobs[job_id].report.gpus_requested == 8
    cluster.resize_job(job_id, nodes=["a", "b"], replicas=8)  # a resend: nothing changes
    assert cluster.jobs[job_id].done == timedelta(minutes=28)
    with pytest.raises(ConnectorError, match="outside 2..8"):
        cluster.resize_job(job_id, nodes=["a"], replicas=9)
    # The plan's GPUs per node are followed: shrunk to 2 + 2 (not 4 on one node).
    cluster.resize_job(job_id, nodes=["a", "b"], replicas=4, gpus={"a": 2, "b": 2})
    assert {n: len(i) for n, i in cluster.jobs[job_id].placement.items()} == {"a": 2, "b": 2}
    cluster.resize_job(job_id, nodes=["a", "b"], replicas=8, gpus={"a": 4, "b": 4})
    assert cluster.jobs[job_id].done == timedelta(minutes=24)  # two more restarts
    # At twice its ask it finishes the 96 minutes left in 48.
    clock.now = T0 + timedelta(hours=1, minutes=49)
    assert _states(cluster)[job_id][0] == "finished"


def test_a_sized_start_takes_the_plans_gpus_on_each_node_or_waits_for_them() -> None:
    cluster, clock = _cluster()
    _submit(cluster, "filler", 6, 120)  # a: 2 GPUs free
    _submit(cluster, "other", 6, 30)  # b: 2 GPUs free
    cluster.submit(JobReport(external_id="e", gpus_requested=8, submit_time=T0), timedelta(hours=1))
    job = cluster.jobs["e"]
    job.asked = 8
    job.report = job.report.model_copy(
        update={"gang_size": 8, "min_replicas": 4, "max_replicas": 16, "replicas": 8}
    )
    assert _states(cluster)["e"] == ("pending", [])
    cluster.start("e", nodes=["a", "b"], replicas=4, gpus={"a": 2, "b": 2})
    assert {n: len(i) for n, i in cluster.jobs["e"].placement.items()} == {"a": 2, "b": 2}
    assert cluster.jobs["e"].report.gpus_requested == 4
    # A plan asking for more on a node than is free there waits (not elsewhere).
    cluster.requeue("e", hold=True)
    cluster.start("e", nodes=["a"], replicas=4, gpus={"a": 4})
    assert _states(cluster)["e"] == ("pending", [])
    clock.now = T0 + timedelta(minutes=31)  # "other" ends: b frees, a still has 2
    assert _states(cluster)["e"] == ("pending", [])


def test_a_service_shrinks_by_gpus_when_a_replica_spans_nodes() -> None:
    """8-GPU replicas on 4-GPU nodes hold whole nodes: a shrink gives back a replica's
    GPUs from its last nodes, and a growth keeps those running where they are."""
    spec = SiteSpec(
        name="wide",
        nodes=(("a", "H100", 4), ("b", "H100", 4), ("c", "H100", 4), ("d", "H100", 4)),
        teams=("serving",),
        kinds=(JobKind.batch_inference,),
        services=(ServiceSpec("big", 2, 8),),
        arrivals_per_hour=0,
    )
    cluster, _ = _cluster(spec)
    service = cluster.jobs["big"]
    service.resized = True
    cluster.resize("big", replicas=2)
    assert sum(map(len, service.placement.values())) == 16
    kept = dict(service.placement)
    cluster.resize("big", replicas=1)
    assert sum(map(len, service.placement.values())) == 8
    assert all(kept[node] == indices for node, indices in service.placement.items())


def test_a_gang_moves_whole_by_a_requeue_held_and_a_start_pinned(tmp_path: Path) -> None:
    """A gang's move (app.actions.recipes): its steps on the simulated scheduler keep its
    work and put it on the new nodes, and only there."""
    four = SiteSpec(
        name="lab",
        nodes=tuple((name, "H100", 4) for name in "abcd"),
        teams=("research",),
        kinds=(JobKind.training,),
        arrivals_per_hour=0,
    )
    cluster, clock = _cluster(four)
    _submit(cluster, "job", 8, 60)
    clock.now = T0 + timedelta(minutes=10)
    assert _states(cluster)["job"] == ("running", ["a", "b"])
    executors = SimExecutors(cluster, state_dir=tmp_path)

    requeue = executors.handle(*_step("requeue", "connector.lab", 1, nodes=["c", "d"], hold=True))
    assert requeue["ok"], requeue
    assert _states(cluster)["job"] == ("pending", [])  # held until its start
    start = executors.handle(*_step("start", "connector.lab", 1, nodes=["c", "d"]))
    assert start["ok"], start
    confirm = executors.handle(
        *_step("confirm", "connector.lab", 1, expect="running", nodes=["c", "d"], exactly=True)
    )
    assert confirm["ok"], confirm
    assert _states(cluster)["job"] == ("running", ["c", "d"])
    assert cluster.jobs["job"].done == timedelta(minutes=10)  # resumed, not started over


def test_a_gang_moved_onto_the_free_halves_of_two_nodes_runs_there(tmp_path: Path) -> None:
    """The solver fills partly used nodes (ClusterState.find_gang); a gang pinned to them
    takes their free GPUs, not only whole free nodes."""
    spec = SiteSpec(
        name="lab",
        nodes=(("a", "K80", 4), ("b", "K80", 4), ("c", "H100", 8), ("d", "H100", 8)),
        teams=("research",),
        kinds=(JobKind.training,),
        arrivals_per_hour=0,
    )
    cluster, clock = _cluster(spec)
    for name, gpus in (("c-full", 8), ("d-full", 8), ("job", 8)):
        _submit(cluster, name, gpus, 600)
    clock.now = T0 + timedelta(minutes=1)
    assert _states(cluster)["job"] == ("running", ["a", "b"])  # the H100s were taken
    for name in ("c-full", "d-full"):
        cluster.cancel(name)
    for name in ("c-half", "d-half"):
        _submit(cluster, name, 4, 600)
    cluster.requeue("d-half", nodes=["d"])
    states = _states(cluster)
    assert (states["c-half"], states["d-half"]) == (("running", ["c"]), ("running", ["d"]))
    executors = SimExecutors(cluster, state_dir=tmp_path)

    for name, args in (
        ("requeue", {"nodes": ["c", "d"], "hold": True}),
        ("start", {"nodes": ["c", "d"]}),
        ("confirm", {"expect": "running", "nodes": ["c", "d"], "exactly": True}),
    ):
        report = executors.handle(*_step(name, "connector.lab", 1, **args))
        assert report["ok"], report
    assert _states(cluster)["job"] == ("running", ["c", "d"])
    assert {n: len(i) for n, i in cluster.jobs["job"].placement.items()} == {"c": 4, "d": 4}
