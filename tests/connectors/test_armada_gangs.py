"""Armada gangs (connectors.armada.gangs): read as one Shaper job of their cardinality, and
stopped, held, started and moved only whole — through the saga's own step messages —
against the project's Armada test server (tests/support/armada_server.py, which runs a gang
all at once or not at all, as Armada's scheduler does; not a real Armada).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.actions.models import ActionKind
from connectors.actions import ConnectorStepExecutor
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.gangs import GANG_CARDINALITY, GANG_ID, GANG_UNIFORMITY, SHAPER_GANG
from connectors.armada.jobs import STOPPED_BY_STEP
from connectors.armada.moves import REPLACED_REASON
from connectors.base import ConnectorError
from tests.connectors.test_armada_actions import Saga, run
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import CLUSTER, HOLD_QUEUE, connector_for, start_server
from wire.steps import ConnectorStep
from wire.telemetry import JobReport, JobState, SchedulerKind, SubmitSpec

GANG = "gang:research/train/g1"


@pytest.fixture
def site() -> Iterator[tuple[ArmadaTestServer, ArmadaConnector]]:
    """The test server and a connector that takes moved jobs (to refuse a gang's)."""
    server = start_server()
    try:
        landing = {"queue": "prod", "job_set": "serve"}
        with connector_for(server, accept_namespaces=["default"], move_job_set=landing) as armada:
            yield server, armada
    finally:
        server.stop()


def member(
    connector: ArmadaConnector, *, size: int = 2, gpus: int = 6, uniform: str | None = None
) -> str:
    """One member of gang g1 (by default 6 GPUs: two of them need two 8-GPU nodes)."""
    return connector.submit_job(
        "research",
        "train",
        NewJob(
            image="registry.local/train:1",
            gpus=gpus,
            annotations={
                GANG_ID: "g1",
                GANG_CARDINALITY: str(size),
                "shaper.io/checkpointable": "true",
                **({GANG_UNIFORMITY: uniform} if uniform else {}),
            },
        ),
    )


def running_gang(server: ArmadaTestServer, connector: ArmadaConnector) -> list[str]:
    """Gang g1 of two 6-GPU members, running on a1 and a2; its members' job ids."""
    members = [member(connector), member(connector)]
    assert sorted(server.schedule()) == sorted(members)
    return members


def only_report(connector: ArmadaConnector) -> JobReport:
    (report,) = connector.read_state().jobs
    return report


def test_a_gang_is_one_job_of_its_cardinality_and_runs_whole(
    site: tuple[ArmadaTestServer, ArmadaConnector],
) -> None:
    server, connector = site
    first = member(connector)
    waiting = only_report(connector)
    assert (waiting.external_id, waiting.gang_size, waiting.gpus_requested) == (GANG, 2, 12)
    assert waiting.state is JobState.pending
    assert waiting.reason.startswith("gang g1: 0 of 2 members running, 1 seen")
    assert server.schedule() == []  # a gang runs whole or not at all
    second = member(connector)
    assert sorted(server.schedule()) == sorted([first, second])

    running = only_report(connector)
    assert (running.external_id, running.state, running.gang_size) == (GANG, JobState.running, 2)
    assert [(a.node, a.gpu_count) for a in running.allocations] == [("a1", 6), ("a2", 6)]
    # Its members checkpoint separately: not a job Shaper checkpoints, nor one it moves.
    assert not running.checkpointable and running.submit is None
    held = {n.name: n for n in connector.read_state().nodes}
    assert held["a1"].gpu_count == 8  # the inventory, not what the gang holds

    connector.cancel(GANG)
    assert {server.job(j).state for j in (first, second)} == {"cancelled"}
    assert only_report(connector).state is JobState.cancelled


def test_a_preempted_gang_is_stopped_held_and_started_again_whole(
    site: tuple[ArmadaTestServer, ArmadaConnector], tmp_path: Path
) -> None:
    server, connector = site
    members = running_gang(server, connector)
    executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)

    preempt = Saga(GANG, ActionKind.preempt, 2, checkpointable=False, gpus=12)
    assert [s.name for s in preempt.steps] == [ConnectorStep.requeue, ConnectorStep.confirm]
    requeue = preempt.message(ConnectorStep.requeue)
    assert requeue["args"]["hold"]
    stopped = run(executor, requeue)
    assert stopped.ok, stopped.error
    assert {server.job(j).state for j in members} == {"cancelled"}
    held = server.jobs_of(HOLD_QUEUE, "train")
    assert len(held) == 2
    for job in held:  # every member, with the gang's annotations and one fresh gang id
        annotations = job.spec.annotations
        assert (annotations[GANG_ID], annotations[SHAPER_GANG]) == ("g1.shaper-1", "g1")
        assert annotations[GANG_CARDINALITY] == "2"
        assert annotations[STOPPED_BY_STEP] == requeue["key"]
    assert len({job.spec.client_id for job in held}) == 2  # one step key, a job per member
    assert run(executor, preempt.message(ConnectorStep.confirm)).ok
    # Resent with the journal lost: the stamps say it was done; nothing stopped again.
    again = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "lost")
    assert run(again, requeue).ok
    assert len(server.jobs_of(HOLD_QUEUE, "train")) == 2
    waiting = only_report(connector)
    assert (waiting.external_id, waiting.state, waiting.restart_count) == (
        GANG,
        JobState.pending,
        1,
    )
    assert "held by Shaper" in waiting.reason
    assert server.schedule() == []

    start = Saga(GANG, ActionKind.start, 3, gpus=12, target_placement={"a1": 6, "a2": 6})
    assert run(executor, start.message(ConnectorStep.start)).ok
    back = [j for j in server.jobs_of("research", "train") if j.state == "queued"]
    assert sorted(j.node_selector["kubernetes.io/hostname"] for j in back) == ["a1", "a2"]
    assert {j.spec.annotations[GANG_ID] for j in back} == {"g1.shaper-2"}
    assert len(server.schedule()) == 2
    confirmed = run(executor, start.message(ConnectorStep.confirm))
    assert confirmed.ok and confirmed.result["nodes"] == ["a1", "a2"], confirmed.error


def test_a_requeue_resent_after_a_crash_between_its_cancels_and_submits_finishes(
    site: tuple[ArmadaTestServer, ArmadaConnector], tmp_path: Path
) -> None:
    server, connector = site
    members = running_gang(server, connector)
    requeue = Saga(GANG, ActionKind.preempt, 2, checkpointable=False, gpus=12).message(
        ConnectorStep.requeue
    )
    # What the first delivery did before the connector died: one member cancelled to be
    # submitted again, nothing submitted.
    connector.catch_up()
    connector._cancel_own(connector.workloads()[members[0]], REPLACED_REASON)
    executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)
    resent = run(executor, requeue)
    assert resent.ok, resent.error
    held = server.jobs_of(HOLD_QUEUE, "train")
    assert {j.spec.annotations[GANG_ID] for j in held} == {"g1.shaper-1"} and len(held) == 2
    # A hold asked while a release's new jobs are not seen yet waits for them (retryable).
    server.lag("research", "train")
    connector.start(GANG)
    with pytest.raises(ConnectorError, match="not in the followed job sets' events yet") as early:
        connector.hold(GANG)
    assert early.value.retryable


def test_a_gang_is_never_split_and_what_would_split_it_is_refused(
    site: tuple[ArmadaTestServer, ArmadaConnector],
) -> None:
    server, connector = site
    first = member(connector, size=3, gpus=4)
    # Not whole yet: submitted again it would wait for a member that never comes.
    with pytest.raises(ConnectorError, match="1 of its 3 members") as partial:
        connector.requeue(GANG, hold=True)
    assert partial.value.retryable
    member(connector, size=3, gpus=4)
    member(connector, size=3, gpus=4)
    cases = [
        (["b1"], r"its 3 members \(4\+4\+4 GPUs\) do not fit there"),
        (["a1", "b1"], "one executor cluster, and they span exec-a, exec-b"),
        (["a1", "zz"], "no node zz is declared"),
    ]
    for nodes, why in cases:
        with pytest.raises(ConnectorError, match=why) as refused:
            connector.start(GANG, nodes=nodes)
        assert not refused.value.retryable
    connector.set_resume_pointer(GANG, "/ckpt/1")
    with pytest.raises(ConnectorError, match="with a resume pointer") as pointer:
        connector.requeue(GANG, hold=True)
    assert not pointer.value.retryable
    assert {j.state for j in server.jobs.values()} == {"queued"}  # nothing was changed
    assert server.job(first).queue == "research"

    # A member's own spec (from an older connector, or written by hand) does not move alone.
    spec = SubmitSpec(
        scheduler=SchedulerKind.armada,
        native={
            "queue": "research",
            "job_set": "train",
            "job": {
                "annotations": {GANG_ID: "g1", GANG_CARDINALITY: "3"},
                "pod_specs": [{"containers": [{"name": "main", "image": "x"}]}],
            },
        },
    )
    with pytest.raises(ConnectorError, match="member of Armada gang g1") as alone:
        connector.submit(spec, name="shaper-5-1")
    assert not alone.value.retryable


def test_a_gang_pinned_where_its_uniformity_label_differs_is_refused(
    site: tuple[ArmadaTestServer, ArmadaConnector],
) -> None:
    server, connector = site
    for _ in range(2):
        member(connector, uniform="kubernetes.io/hostname")
    with pytest.raises(ConnectorError, match="one value of kubernetes.io/hostname"):
        connector.start(GANG, nodes=["a1", "a2"])
    # Armada's scheduler keeps such a gang to one node's worth: 12 GPUs fit on none here.
    assert server.schedule() == []


def test_a_queued_job_set_moves_to_another_executor_with_its_gangs_whole(
    site: tuple[ArmadaTestServer, ArmadaConnector],
) -> None:
    server, connector = site
    for _ in range(2):
        member(connector, gpus=4)
    # Two 4-GPU members need 8 GPUs of one executor; exec-b has 4.
    with pytest.raises(ConnectorError, match=r"gang g1: its 2 members \(4\+4 GPUs\) do not fit"):
        connector.move_job_set("research", "train", executor="exec-b")
    assert {j.state for j in server.jobs.values()} == {"queued"}
    connector.cancel(GANG)
    for _ in range(2):
        member(connector, gpus=2)
    moved = connector.move_job_set("research", "train", executor="exec-b")
    again = [server.job(job_id) for job_id in moved.values()]
    assert {j.spec.annotations[GANG_ID] for j in again} == {"g1.shaper-1"}
    assert {j.node_selector["shaper.io/armada-executor"] for j in again} == {"exec-b"}
    assert sorted(server.schedule()) == sorted(moved.values())
    assert {server.job(job_id).node for job_id in moved.values()} == {"b1"}
