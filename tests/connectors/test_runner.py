"""The runner's push protocol: snapshots, deltas, sequence numbers, retries and resyncs."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime

import httpx
import pytest

from connectors.base import ConnectorError
from connectors.runner import (
    RunnerConfig,
    RunnerFatal,
    TelemetryRunner,
    main,
    speeds_on_known_models,
)
from tests.connectors.control_plane import ControlPlane
from wire.telemetry import ClusterState, JobReport, JobState, NodeReport, SchedulerKind

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def node(name: str, **fields) -> NodeReport:
    return NodeReport(name=name, **{"gpu_model": "h100", "gpu_count": 2, **fields})


def job(job_id: str, **fields) -> JobReport:
    return JobReport(external_id=job_id, gpus_requested=1, **fields)


def state(nodes: list[NodeReport], jobs: list[JobReport]) -> ClusterState:
    return ClusterState(observed_at=T0, nodes=nodes, jobs=jobs)


class ScriptedConnector:
    """Returns the given states one read at a time (the last one forever); raises errors."""

    kind = SchedulerKind.sim
    cluster = "hpc-a"

    def __init__(self, *reads: ClusterState | ConnectorError) -> None:
        self.reads = list(reads)
        self.calls = 0

    def read_state(self) -> ClusterState:
        self.calls += 1
        item = self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
        if isinstance(item, ConnectorError):
            raise item
        return item


class Harness:
    def __init__(self, connector: ScriptedConnector, plane: ControlPlane, **config) -> None:
        self.sleeps: list[float] = []
        self.now = 0.0
        self.plane = plane
        self.runner = TelemetryRunner(
            connector,
            RunnerConfig(
                control_plane="http://control-plane.test",
                cluster=plane.cluster,
                token=plane.token,
                **config,
            ),
            transport=plane.transport(),
            sleep=self.sleeps.append,
            clock=lambda: T0,
            monotonic=lambda: self.now,
            session_id="session-1",
            rng=random.Random(7),
        )


BASE = state([node("n1"), node("n2")], [job("1", state=JobState.running), job("2")])


def test_first_push_is_a_snapshot_then_deltas_of_what_changed() -> None:
    plane = ControlPlane()
    changed = state(
        [node("n1"), node("n3")],  # n2 vanished, n3 is new
        [job("1", state=JobState.finished), job("2"), job("4")],
    )
    harness = Harness(ScriptedConnector(BASE, changed, changed), plane)

    acks = [harness.runner.run_once() for _ in range(3)]

    assert [(r.kind, r.seq, r.session) for r in plane.received] == [
        ("snapshot", 0, "session-1"),
        ("delta", 1, "session-1"),
        ("delta", 2, "session-1"),
    ]
    assert [ack.seq for ack in acks if ack] == [0, 1, 2]
    snapshot, delta, idle = (r.body for r in plane.received)
    assert [n["name"] for n in snapshot["nodes"]] == ["n1", "n2"]
    assert snapshot["sent_at"] == "2026-11-02T12:00:00Z"
    assert [n["name"] for n in delta["nodes"]] == ["n3"]
    assert [j["external_id"] for j in delta["jobs"]] == ["1", "4"]
    assert (delta["removed_nodes"], delta["removed_jobs"]) == (["n2"], [])
    assert (idle["nodes"], idle["jobs"], idle["removed_nodes"]) == ([], [], [])
    assert sorted(plane.nodes) == ["n1", "n3"] and sorted(plane.jobs) == ["1", "2", "4"]
    assert plane.jobs["1"]["state"] == "finished"


def test_reports_shared_between_reads_are_not_compared_field_by_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An incremental connector hands back the same report objects for what did not
    change: the delta leaves them out by identity, without calling ``__eq__``; a new
    object is still compared by value (equal: left out; different: sent)."""
    shared_node, shared_job = node("n1"), job("1", state=JobState.running)
    first = state([shared_node, node("n2")], [shared_job, job("2"), job("3")])
    second = state(
        [shared_node, node("n2")], [shared_job, job("2"), job("3", state=JobState.running)]
    )
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(first, second), plane)
    harness.runner.run_once()
    compared: list[str] = []
    real_eq = JobReport.__eq__

    def counting_eq(self: JobReport, other: object) -> bool:
        compared.append(self.external_id)
        return real_eq(self, other)

    monkeypatch.setattr(JobReport, "__eq__", counting_eq)
    harness.runner.run_once()

    delta = plane.received[-1].body
    assert (delta["kind"], [j["external_id"] for j in delta["jobs"]]) == ("delta", ["3"])
    assert delta["nodes"] == []
    assert sorted(compared) == ["2", "3"]  # "1" is the acknowledged object itself


def test_speeds_on_models_no_node_has_are_left_out_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job's owner writes its speeds: a model the cluster has no node of would have the
    control plane refuse the whole push (not in its catalogue) or could not be planned on;
    it is left out, with one warning per job, and the jobs without one stay the same
    objects (the delta's identity check). A model named in another case than the nodes'
    is theirs, sent in their spelling."""
    plain = job("2")
    read = state(
        [node("n1"), node("n2", gpu_model="a100")],
        [job("1", speeds={"H100": 2.0, "a100": 1.0, "b300": 4.0}), plain],
    )
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(read), plane)
    with caplog.at_level(logging.WARNING, logger="connectors.runner"):
        harness.runner.run_once()
        harness.runner.run_once()
    (snapshot, idle) = (r.body for r in plane.received)
    assert {j["external_id"]: j.get("speeds") for j in snapshot["jobs"]} == {
        "1": {"h100": 2.0, "a100": 1.0},
        "2": None,  # none: left out, as a connector before the field sent it
    }
    assert idle["jobs"] == []  # the kept speeds compare equal to the acknowledged ones
    warnings = [r.getMessage() for r in caplog.records if "speeds" in r.getMessage()]
    assert warnings == [
        "job 1: leaving out its speeds on b300: no node of this cluster has that GPU model "
        "(known: a100, h100)"
    ]
    unchanged = state([node("n1")], [plain])
    warned = {"1", "gone"}
    assert speeds_on_known_models(unchanged, warned) is unchanged
    assert warned == set()  # jobs that are gone are forgotten: the set does not grow for ever


def test_409_sends_a_snapshot_at_once_with_the_next_seq() -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane)
    harness.runner.run_once()
    plane.last_seq = None  # the control plane lost track of this session (e.g. restored)

    ack = harness.runner.run_once()

    assert [(r.kind, r.seq, r.status) for r in plane.received] == [
        ("snapshot", 0, 200),
        ("delta", 1, 409),
        ("snapshot", 2, 200),
    ]
    assert ack is not None and ack.seq == 2
    assert harness.runner.stats.conflicts == 1
    harness.runner.run_once()
    assert (plane.received[-1].kind, plane.received[-1].seq) == ("delta", 3)


def test_a_superseded_session_stops_the_runner_instead_of_resyncing_for_ever() -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane)
    harness.runner.run_once()
    # A second connector on the same cluster sends a snapshot: it takes the cluster over.
    plane.session, plane.superseded = "session-2", {"session-1"}
    with pytest.raises(RunnerFatal, match="superseded by a newer connector for hpc-a"):
        harness.runner.run_once()
    assert [r.status for r in plane.received] == [200, 409]


@pytest.mark.parametrize(
    "failure",
    [500, 502, 503, 429, httpx.ConnectError("refused"), httpx.ReadTimeout("slow")],
    ids=str,
)
def test_server_errors_retry_the_same_payload_with_backoff(failure) -> None:
    plane = ControlPlane(script=[failure, failure, failure])
    harness = Harness(ScriptedConnector(BASE), plane, backoff_initial_s=1.0, backoff_max_s=3.0)

    ack = harness.runner.run_once()

    assert ack is not None and ack.seq == 0
    bodies = [r.body for r in plane.received]
    assert len(bodies) == 4 and all(body == bodies[0] for body in bodies)
    # Exponential with jitter: each delay lies in [ceiling/2, ceiling], ceiling capped at 3 s.
    assert len(harness.sleeps) == 3
    for delay, ceiling in zip(harness.sleeps, [1.0, 2.0, 3.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(harness.sleeps)) == 3
    assert harness.runner.stats.push_failures == 3


def test_a_replayed_seq_acknowledged_as_duplicate_counts_as_accepted() -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane)
    harness.runner.run_once()
    # The control plane stores seq 1 but its answer is lost: the runner pushes seq 1 again.
    plane.lose_answers = 1
    ack = harness.runner.run_once()

    assert ack is not None and ack.duplicate is True and ack.seq == 1
    assert harness.runner.stats.duplicates == 1
    harness.runner.run_once()
    assert plane.received[-1].seq == 2 and plane.received[-1].status == 200


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_are_fatal(status: int) -> None:
    plane = ControlPlane(script=[status])
    harness = Harness(ScriptedConnector(BASE), plane)
    with pytest.raises(RunnerFatal, match="connector:hpc-a"):
        harness.runner.run_once()


def test_a_wrong_token_is_fatal() -> None:
    plane = ControlPlane()
    runner = TelemetryRunner(
        ScriptedConnector(BASE),
        RunnerConfig(control_plane="http://cp.test", cluster="hpc-a", token="wrong"),
        transport=plane.transport(),
        sleep=lambda _: None,
    )
    with pytest.raises(RunnerFatal, match="refused the token"):
        runner.run_once()


def test_an_unknown_cluster_is_fatal() -> None:
    plane = ControlPlane(cluster="hpc-b")
    runner = TelemetryRunner(
        ScriptedConnector(BASE),
        RunnerConfig(control_plane="http://cp.test", cluster="hpc-a", token=plane.token),
        transport=plane.transport(),
        sleep=lambda _: None,
    )
    with pytest.raises(RunnerFatal, match="404.*check --control-plane and --cluster"):
        runner.run_once()


@pytest.mark.parametrize("status", [413, 422, 400])
def test_a_refused_payload_is_logged_and_resynced_next_cycle(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane)
    harness.runner.run_once()
    plane.script = [status]

    assert harness.runner.run_once() is None
    assert "control plane refused delta seq 1" in caplog.text
    assert harness.sleeps == []  # no hot retry of a payload the control plane refuses
    harness.runner.run_once()

    assert [(r.kind, r.seq, r.status) for r in plane.received] == [
        ("snapshot", 0, 200),
        ("delta", 1, status),
        ("snapshot", 2, 200),
    ]
    assert harness.runner.stats.refused_payloads == 1


def test_scheduler_outage_backs_off_pushes_nothing_and_resyncs_with_a_snapshot() -> None:
    plane = ControlPlane()
    down = ConnectorError("slurm_load_jobs: Unable to contact slurm controller", retryable=True)
    after = state([node("n1"), node("n2")], [job("1", state=JobState.finished)])
    connector = ScriptedConnector(BASE, down, down, down, after)
    harness = Harness(connector, plane, backoff_initial_s=0.5, backoff_max_s=10.0)
    harness.runner.run_once()

    harness.runner.run_once()

    assert connector.calls == 5
    assert [(r.kind, r.seq) for r in plane.received] == [("snapshot", 0), ("snapshot", 1)]
    assert [j["external_id"] for j in plane.received[1].body["jobs"]] == ["1"]
    assert sorted(plane.jobs) == ["1"]  # job 2 vanished while the scheduler was away
    assert len(harness.sleeps) == 3 and harness.sleeps == sorted(harness.sleeps)
    assert harness.runner.stats.read_failures == 3


def test_a_non_retryable_read_error_is_fatal() -> None:
    plane = ControlPlane()
    error = ConnectorError("unknown API openapi/v0.0.41", retryable=False)
    harness = Harness(ScriptedConnector(error), plane)
    with pytest.raises(RunnerFatal, match="v0.0.41"):
        harness.runner.run_once()
    assert plane.received == []


def test_periodic_resync_sends_a_snapshot() -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane, resync_interval_s=100.0)
    harness.runner.run_once()
    harness.now = 99.0
    harness.runner.run_once()
    harness.now = 100.0
    harness.runner.run_once()
    harness.runner.run_once()
    assert [r.kind for r in plane.received] == ["snapshot", "delta", "snapshot", "delta"]
    assert [r.seq for r in plane.received] == [0, 1, 2, 3]


def test_run_sleeps_the_interval_between_cycles_and_stops() -> None:
    plane = ControlPlane()
    harness = Harness(ScriptedConnector(BASE), plane, interval_s=7.0)
    harness.runner.run(max_cycles=3)
    assert harness.sleeps == [7.0, 7.0]
    assert [r.seq for r in plane.received] == [0, 1, 2]


def test_stop_ends_a_retry_loop() -> None:
    plane = ControlPlane(script=[503] * 100)
    harness = Harness(ScriptedConnector(BASE), plane)
    harness.runner._sleep = lambda _: harness.runner.stop()  # noqa: SLF001
    assert harness.runner.run_once() is None
    assert len(plane.received) == 1


def test_each_process_start_gets_its_own_session() -> None:
    config = RunnerConfig(control_plane="http://cp.test", cluster="hpc-a", token="t")
    first = TelemetryRunner(ScriptedConnector(BASE), config)
    second = TelemetryRunner(ScriptedConnector(BASE), config)
    assert first.session_id != second.session_id
    assert 0 < len(first.session_id) <= 64
    first.close()
    second.close()


def test_main_refuses_a_bad_connector_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--kind=slurm",
            "--cluster=hpc-a",
            "--control-plane=http://127.0.0.1:9",
            "--token=t",
            "--set",
            "rest_api_version=v0.0.99",
        ]
    )
    assert code == 2
    assert "bad configuration for slurm" in capsys.readouterr().err


def test_main_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHAPER_CONNECTOR_TOKEN", raising=False)
    with pytest.raises(SystemExit) as caught:
        main(["--kind=slurm", "--cluster=hpc-a", "--control-plane=http://127.0.0.1:9"])
    assert caught.value.code == 2
