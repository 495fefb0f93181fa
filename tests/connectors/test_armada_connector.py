"""The Armada connector against the Armada test server (tests/support/armada_server.py):
Armada's real gRPC API through armada-client, over a real connection, with Armada's
documented semantics — not a real Armada, which cannot run here (it needs Pulsar).

Telemetry of queued and running jobs with their executor cluster and node; cancel and
reprioritize; the event stream resumed after a dropped connection and after a server
restart; unknown queues; moving a queued job set to another executor cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import pytest
from armada_client.armada import submit_pb2
from armada_client.client import ArmadaClient

from app.telemetry.physics import check_push
from connectors import registry
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.jobs import (
    ArmadaJob,
    EventKind,
    JobEvent,
    JobSpec,
    Phase,
    apply,
)
from connectors.armada.reports import job_report
from connectors.base import (
    ConnectorError,
    SupportsCancel,
    SupportsHold,
    SupportsRequeue,
    SupportsResumePointer,
    SupportsStart,
    SupportsStepKey,
)
from connectors.runner import RunnerConfig, TelemetryRunner
from tests.connectors.control_plane import ControlPlane
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import (
    CLUSTER,
    EXECUTOR_LABEL,
    GPU_LABEL,
    config_for,
    connector_for,
    start_server,
)
from wire.telemetry import ClusterState, JobKind, JobState, SchedulerKind, TelemetrySnapshot


@pytest.fixture
def server() -> Iterator[ArmadaTestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def connector(server: ArmadaTestServer) -> Iterator[ArmadaConnector]:
    with connector_for(server) as connector:
        yield connector


def job(gpus: int, **fields: object) -> NewJob:
    return NewJob.model_validate({"image": "registry.local/train:1", "gpus": gpus, **fields})


def armada_states(server: ArmadaTestServer, *job_ids: str) -> dict[str, int]:
    """Armada's own answer (GetJobStatus, through the official client) for those jobs."""
    channel = grpc.insecure_channel(server.address)
    try:
        return dict(ArmadaClient(channel).get_job_status(list(job_ids)).job_states)
    finally:
        channel.close()


def test_queued_and_running_jobs_are_reported_with_executor_and_node(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    labels = {"shaper.io/team": "vision", "shaper.io/kind": "training"}
    on_h100 = connector.submit_job(
        "research",
        "train",
        job(
            4,
            labels=labels,
            node_selector={GPU_LABEL: "H100"},
            annotations={"shaper.io/checkpointable": "true"},
        ),
    )
    too_big = connector.submit_job("prod", "serve", job(16))
    assert server.schedule() == [on_h100]

    state = connector.read_state()
    reports = {report.external_id: report for report in state.jobs}
    running, queued = reports[on_h100], reports[too_big]
    assert running.state is JobState.running
    assert [(a.node, a.gpus) for a in running.allocations] == [("a1", 4)]
    assert (running.queue, running.team, running.kind, running.priority) == (
        "research",
        "vision",
        JobKind.training,
        10,
    )
    assert running.gpus_requested == 4 and running.allowed_gpu_models == ["H100"]
    assert running.checkpointable and running.start_time is not None
    assert queued.state is JobState.pending and not queued.allocations
    assert (queued.queue, queued.priority, queued.gpus_requested) == ("prod", 100, 16)
    assert not queued.checkpointable

    nodes = {node.name: node for node in state.nodes}
    assert set(nodes) == {"a1", "a2", "b1"}
    assert nodes["a1"].labels["armadaproject.io/executor"] == "exec-a"
    assert (nodes["b1"].gpu_model, nodes["b1"].gpu_count) == ("A100", 4)
    # What the connector reports is what Armada itself answers for those jobs.
    assert armada_states(server, on_h100, too_big) == {
        on_h100: submit_pb2.RUNNING,
        too_big: submit_pb2.QUEUED,
    }


def test_a_node_only_the_events_name_holds_what_runs_there(server: ArmadaTestServer) -> None:
    with connector_for(server, nodes=[]) as connector:
        job_id = connector.submit_job("research", "train", job(2))
        server.schedule()
        (node,) = connector.read_state().nodes
    assert (node.name, node.gpu_count, node.labels) == (
        "a1",
        2,
        {"armadaproject.io/executor": "exec-a"},
    )
    assert server.job(job_id).node == "a1"


def _spec() -> JobSpec:
    return JobSpec(
        priority=0,
        namespace="default",
        labels={},
        annotations={},
        node_selector={},
        gpus=1,
        encoded=b"",
    )


def test_the_lifecycle_folds_in_armadas_order() -> None:
    """submitted → queued → leased → (lease returned: queued again) → leased → pending →
    running → succeeded; nothing revives a job that ended."""
    config = config_for(ArmadaTestServer())
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def event(kind: EventKind, **fields: object) -> JobEvent:
        return JobEvent(
            message_id="1-0",
            kind=kind,
            job_id="J",
            queue="research",
            job_set="train",
            at=at,
            **fields,  # type: ignore[arg-type]
        )

    folded: ArmadaJob | None = None
    seen = []
    for step in (
        event(EventKind.submitted, spec=_spec()),
        event(EventKind.queued),
        event(EventKind.leased, executor="exec-a"),
        event(EventKind.lease_returned, reason="pod could not be created"),
        event(EventKind.leased, executor="exec-b"),
        event(EventKind.pending, executor="exec-b"),
        event(EventKind.running, executor="exec-b", node="b1"),
        event(EventKind.succeeded, node="b1"),
        event(EventKind.running, executor="exec-a", node="a1"),
    ):
        folded = apply(folded, step)
        assert folded is not None
        report = job_report(folded, config)
        seen.append((folded.phase, report.state, report.reason))
    assert seen == [
        (Phase.queued, JobState.pending, ""),
        (Phase.queued, JobState.pending, ""),
        (Phase.leased, JobState.pending, "leased to executor exec-a"),
        (Phase.queued, JobState.pending, "pod could not be created"),
        (Phase.leased, JobState.pending, "leased to executor exec-b"),
        (Phase.pending, JobState.pending, "pod starting on executor exec-b"),
        (Phase.running, JobState.running, ""),
        (Phase.succeeded, JobState.finished, ""),
        (Phase.succeeded, JobState.finished, ""),
    ]
    # An event of a job whose submission was never seen tells nothing.
    assert apply(None, event(EventKind.running, node="a1")) is None


def test_cancel_and_reprioritize(server: ArmadaTestServer, connector: ArmadaConnector) -> None:
    first = connector.submit_job("research", "sweep", job(8, priority=5))
    second = connector.submit_job("research", "sweep", job(8, priority=5))
    third = connector.submit_job("research", "sweep", job(8, priority=5))
    connector.read_state()

    connector.cancel(first)
    connector.cancel(first)  # idempotent: a cancelled job is left as it is
    assert server.job(first).state == "cancelled"
    states = {report.external_id: report.state for report in connector.read_state().jobs}
    assert states[first] is JobState.cancelled

    # Armada runs lower priorities first: the third job, now at 1, goes before the second.
    connector.reprioritize(third, priority=1)
    connector.catch_up()
    assert server.job(third).priority == 1 and connector.workloads()[third].priority == 1
    started = server.schedule()
    assert started[0] == third

    # A whole job set at once: every job that has not ended.
    connector.reprioritize_job_set("research", "sweep", priority=7)
    connector.catch_up()
    assert {j.job_id: j.priority for j in connector.workloads().values()} == {
        first: 5,  # cancelled: Armada leaves it alone
        second: 7,
        third: 7,
    }


def test_armadas_own_preempt_and_a_job_sets_cancel(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    running = connector.submit_job("research", "sweep", job(8))
    assert server.schedule() == [running]
    queued = connector.submit_job("research", "sweep", job(8, priority=5))
    other = connector.submit_job("research", "train", job(8))
    connector.preempt(queued)  # Armada preempts only a job that holds a node: nothing
    connector.preempt(running)
    assert (server.job(running).state, server.job(queued).state) == ("preempted", "queued")
    states = {report.external_id: report.state for report in connector.read_state().jobs}
    assert states[running] is JobState.failed  # ended by Armada, not finished
    assert "preempted" in next(
        r.reason for r in connector.read_state().jobs if r.external_id == running
    )

    connector.cancel_job_set("research", "sweep")
    assert server.job(queued).state == "cancelled"
    assert server.job(running).state == "preempted"  # an ended job is left as it is
    assert server.job(other).state != "cancelled"  # another job set
    states = {report.external_id: report.state for report in connector.read_state().jobs}
    assert states[queued] is JobState.cancelled


def test_the_event_stream_resumes_after_a_dropped_connection(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    ids = [connector.submit_job("research", "train", job(2)) for _ in range(3)]
    connector.read_state()
    before = connector.resume_point("research", "train")
    assert server.schedule() == ids  # 3 × leased, pending, running: 9 new messages

    server.drop_next_stream(after=4)
    with pytest.raises(ConnectorError) as dropped:
        connector.read_state()
    assert dropped.value.retryable and "UNAVAILABLE" in str(dropped.value)
    halfway = connector.resume_point("research", "train")
    assert halfway != before  # the four messages that arrived are applied and kept

    state = connector.read_state()
    resumed = [r for r in server.event_requests if (r.queue, r.id) == ("research", "train")]
    assert resumed[-1].from_message_id == halfway  # asked only for what it had not seen
    assert {r.external_id: r.state for r in state.jobs} == dict.fromkeys(ids, JobState.running)
    assert sorted(a.node for r in state.jobs for a in r.allocations) == ["a1", "a1", "a1"]


def test_the_event_stream_resumes_after_the_server_restarts(server: ArmadaTestServer) -> None:
    with connector_for(server, timeout_s=1.0) as connector:
        job_id = connector.submit_job("research", "train", job(1))
        connector.read_state()
        server.stop()
        with pytest.raises(ConnectorError) as down:
            connector.read_state()
        assert down.value.retryable
        server.start()  # same port, same jobs: a server that came back
        server.schedule()
        (report,) = read_when_back(connector).jobs
    assert (report.external_id, report.state) == (job_id, JobState.running)


def read_when_back(connector: ArmadaConnector, within_s: float = 10.0) -> ClusterState:
    """Read as the runner does after a failure: again while the error is retryable (gRPC
    waits out its reconnect back-off before it dials a server that came back)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return connector.read_state()
        except ConnectorError as error:
            if not error.retryable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_an_unknown_queue_is_an_error_that_retrying_does_not_fix(
    server: ArmadaTestServer,
) -> None:
    with connector_for(server, job_sets=[{"queue": "nope", "job_set": "x"}]) as connector:
        with pytest.raises(ConnectorError) as read:
            connector.read_state()
        with pytest.raises(ConnectorError) as submitted:
            connector.submit_job("nope", "x", job(1))
    for error in (read.value, submitted.value):
        assert not error.retryable
        assert "NOT_FOUND" in str(error) and "Queue nope does not exist" in str(error)


def test_bad_requests_are_refused_with_a_clear_error(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    # Armada's own answer: INVALID_ARGUMENT, not worth a retry.
    with pytest.raises(ConnectorError) as empty:
        connector.submit_job("research", "", job(1))
    assert not empty.value.retryable and "INVALID_ARGUMENT" in str(empty.value)
    # armada-client's own check, before anything is sent.
    with pytest.raises(ConnectorError) as unnamed:
        connector.reprioritize_job_set("research", "", priority=1)
    assert not unnamed.value.retryable and "job_set_id must be provided" in str(unnamed.value)
    with pytest.raises(ConnectorError) as unknown:
        connector.cancel("01NOSUCHJOB000000000000000")
    assert not unknown.value.retryable and "no job 01NOSUCHJOB" in str(unknown.value)


def test_the_kind_registers_and_builds_from_options(server: ArmadaTestServer) -> None:
    import connectors.armada  # noqa: F401  (registers the kind, as the runner does)

    connector = registry.create(
        SchedulerKind.armada,
        cluster=CLUSTER,
        url=server.address,
        job_sets=[{"queue": "research", "job_set": "train"}],
    )
    assert isinstance(connector, ArmadaConnector) and connector.kind is SchedulerKind.armada
    assert connector.read_state().jobs == []
    connector.close()
    with pytest.raises(ValueError, match="job_sets"):
        registry.create(SchedulerKind.armada, cluster=CLUSTER, url=server.address, job_sets=[])


def test_a_queued_job_set_moves_to_another_executor_where_it_fits(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    pins = ({"kubernetes.io/hostname": "a1"}, {})  # a pin to a node of exec-a is dropped
    small = [connector.submit_job("research", "sweep", job(2, node_selector=p)) for p in pins]
    moved = connector.move_job_set("research", "sweep", executor="exec-b")
    assert set(moved) == set(small)  # workload ids stay; Armada made new jobs
    for workload, new_id in moved.items():
        assert new_id != workload
        assert server.job(workload).state == "cancelled"
        assert server.job(new_id).node_selector == {EXECUTOR_LABEL: "exec-b"}
    server.schedule()
    state = connector.read_state()
    assert {r.external_id: (r.state, [a.node for a in r.allocations]) for r in state.jobs} == {
        workload: (JobState.running, ["b1"]) for workload in small
    }
    assert {r.restart_count for r in state.jobs} == {1}
    # Moved, they keep their place in the queue's history.
    submitted = {w: connector.workloads()[w].first_submitted_at for w in small}
    assert {r.external_id: r.submit_time for r in state.jobs} == submitted
    assert all(connector.workloads()[w].submitted_at > submitted[w] for w in small)

    # A job that needs more GPUs than any node of exec-b has stays where it is …
    big = connector.submit_job("research", "train", job(8))
    with pytest.raises(ConnectorError, match=f"{big}: needs 8 GPUs") as misfit:
        connector.move_job_set("research", "train", executor="exec-b")
    assert not misfit.value.retryable and server.job(big).state == "queued"
    # … and a job set that has started does not move at all.
    with pytest.raises(ConnectorError, match="only a queued job set moves"):
        connector.move_job_set("research", "sweep", executor="exec-a")


def test_the_runner_pushes_armada_telemetry_and_resyncs_after_a_dropped_stream(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    plane = ControlPlane(cluster=CLUSTER)
    sleeps: list[float] = []
    runner = TelemetryRunner(
        connector,
        RunnerConfig(
            control_plane="http://control-plane.test",
            cluster=CLUSTER,
            token=plane.token,
            backoff_initial_s=0.01,
        ),
        transport=plane.transport(),
        sleep=sleeps.append,
        session_id="armada-session",
    )
    first, second = (connector.submit_job("research", "train", job(4)) for _ in range(2))
    runner.run_once()
    server.schedule()
    runner.run_once()
    server.finish(first)
    server.finish(second, failed="OOMKilled")
    server.drop_next_stream(after=1)  # of these two events
    runner.run_once()
    runner.close()

    assert [(r.kind, r.status) for r in plane.received] == [
        ("snapshot", 200),
        ("delta", 200),
        ("snapshot", 200),  # the read failed half-way: what happened meanwhile is re-sent
    ]
    assert len(sleeps) == 1 and runner.stats.read_failures == 1
    assert [j["state"] for j in plane.received[1].body["jobs"]] == ["running", "running"]
    assert {j: plane.jobs[j]["state"] for j in (first, second)} == {
        first: "finished",
        second: "failed",
    }
    # Each snapshot is a possible cluster by the control plane's own rules.
    for received in plane.received:
        if received.kind == "snapshot":
            check_push(
                TelemetrySnapshot.model_validate(received.body),
                now=datetime.now(UTC),
                catalogue={"H100", "A100", "gpu"},
                stored_nodes={},
                stored_jobs=(),
                stored_holdings=(),
            )


def test_a_queued_job_is_held_in_the_cordoned_queue_and_released(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    capabilities = (
        SupportsHold,
        SupportsRequeue,
        SupportsStart,
        SupportsCancel,
        SupportsResumePointer,
        SupportsStepKey,
    )
    assert all(isinstance(connector, capability) for capability in capabilities)
    job_id = connector.submit_job("research", "train", job(2, priority=3))
    connector.hold(job_id)
    connector.hold(job_id)  # idempotent: it is held already
    assert server.schedule() == []
    (held,) = connector.read_state().jobs
    assert (held.external_id, held.state, held.queue) == (job_id, JobState.pending, "research")
    assert held.reason.startswith("held by Shaper")
    # Held, it still asks for its GPUs: a plan must be able to start it again.
    assert (held.gpus_requested, held.required_nodes) == (2, [])

    connector.release(job_id)
    (started,) = server.schedule()
    assert server.job(started).queue == "research" and server.job(started).priority == 3
    (running,) = connector.read_state().jobs
    assert (running.external_id, running.state, running.restart_count) == (
        job_id,
        JobState.running,
        2,
    )
    with pytest.raises(ConnectorError, match="only a queued job can be held"):
        connector.hold(job_id)


def test_a_plans_start_puts_the_job_first_in_its_queue_where_it_is_pinned(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    """Armada has no call that starts a job: the start makes it the job Armada's
    scheduler runs next on the plan's node, by its node selector and its place in its
    queue (lower priority first)."""
    on_a1 = {"kubernetes.io/hostname": "a1", EXECUTOR_LABEL: "exec-a"}
    filler = connector.submit_job("research", "train", job(8, node_selector={EXECUTOR_LABEL: "x"}))
    busy = connector.submit_job(
        "research", "train", job(8, node_selector={"kubernetes.io/hostname": "a2"})
    )
    assert server.schedule() == [busy]  # a2 is taken; no node is labelled executor x
    peer = connector.submit_job("research", "sweep", job(8, priority=2))
    mine = connector.submit_job("research", "train", job(8, priority=5, node_selector=on_a1))
    # Ahead of it, but no rival for a1: pinned to b1.
    apart = connector.submit_job(
        "research", "sweep", job(4, priority=1, node_selector={"kubernetes.io/hostname": "b1"})
    )
    reports = {r.external_id: r for r in connector.read_state().jobs}
    assert reports[mine].required_nodes == ["a1"] and reports[peer].required_nodes == []
    assert reports[filler].required_nodes == []  # no declared node has the label: unknown

    connector.start(mine, nodes=["a1"])
    # Pinned there already: reprioritized in place (ReprioritizeJobs), just ahead of the peer.
    assert (server.job(mine).state, server.job(mine).priority) == ("queued", 1)
    connector.catch_up()
    assert connector.workloads()[mine].job_id == mine and server.job(peer).priority == 2
    before = len(server.events_after("research", "train", ""))
    connector.start(mine, nodes=["a1"])  # a resent start finds it first: nothing more
    assert len(server.events_after("research", "train", "")) == before
    assert sorted(server.schedule()) == sorted([apart, mine])
    assert (server.job(mine).node, server.job(peer).state) == ("a1", "queued")
    connector.start(mine, nodes=["a1"])  # running: left alone
    # Requeued later (a plan's preemption), it queues at its own priority again, not at
    # the one the start put it first with: one start does not keep it ahead for good.
    connector.requeue(mine)
    connector.catch_up()
    again = connector.workloads()[mine]
    assert again.job_id != mine and server.job(again.job_id).priority == 5
    assert again.own_priority == 5


def test_a_plans_start_on_another_executors_node_moves_the_queued_job_there(
    server: ArmadaTestServer, connector: ArmadaConnector
) -> None:
    pinned = connector.submit_job(
        "research", "train", job(4, node_selector={EXECUTOR_LABEL: "exec-a"})
    )
    (report,) = connector.read_state().jobs
    assert report.required_nodes == ["a1", "a2"]  # where Armada may run it: exec-a's nodes

    connector.start(pinned, nodes=["b1"])
    connector.catch_up()
    moved = connector.workloads()[pinned]
    assert moved.job_id != pinned and server.job(pinned).state == "cancelled"
    assert moved.spec.node_selector == {"kubernetes.io/hostname": "b1", EXECUTOR_LABEL: "exec-b"}
    assert server.schedule() == [moved.job_id] and server.job(moved.job_id).node == "b1"

    big = connector.submit_job("research", "train", job(8))
    with pytest.raises(ConnectorError, match="on b1: needs 8 GPUs") as misfit:
        connector.start(big, nodes=["b1"])
    assert not misfit.value.retryable and server.job(big).state == "queued"


def test_a_configured_token_goes_with_every_call(server: ArmadaTestServer) -> None:
    with connector_for(server, token="s3cret") as connector:
        connector.submit_job("research", "train", job(1))
        connector.read_state()
    assert server.authorizations and set(server.authorizations) == {"Bearer s3cret"}
    assert "s3cret" not in repr(connector.config)


def test_a_token_goes_over_plain_grpc_only_to_this_machine_or_when_allowed() -> None:
    """Armada's bearer token lets whoever holds it act as this connector; over plain gRPC
    anyone on the path reads it."""
    from connectors.armada.config import ArmadaConnectorConfig

    base = {"cluster": "lab", "job_sets": [{"queue": "research", "job_set": "train"}]}
    remote = {**base, "url": "armada.example.org:50051", "token": "s3cret"}
    with pytest.raises(ValueError, match="token: would be sent in the clear over plain gRPC"):
        ArmadaConnectorConfig.model_validate(remote)
    for fine in (
        {**remote, "tls": True},
        {**remote, "allow_insecure_token": True},
        {**remote, "url": "127.0.0.1:50051"},
        {**remote, "url": "[::1]:50051"},
        {**base, "url": "armada.example.org:50051"},  # no token, nothing to leak
    ):
        ArmadaConnectorConfig.model_validate(fine)
