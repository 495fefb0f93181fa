"""The Slurm connector and the runner against a real Slurm 22.05 cluster (see conftest)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import httpx
import pytest

from connectors import registry
from connectors.base import (
    Connector,
    ConnectorError,
    SupportsCancel,
    SupportsHold,
    SupportsRequeue,
    SupportsSuspend,
)
from connectors.runner import RunnerConfig, TelemetryRunner
from connectors.slurm import SlurmConnector, SupportsNodeCount
from connectors.slurm.hostlist import expand_hostlist, expand_index_list
from connectors.slurm.parse import LABEL_PARTITIONS
from tests.connectors.conftest import SlurmCluster
from tests.connectors.control_plane import ControlPlane
from tests.support.refusing_slurm import RefusingSlurm
from wire.telemetry import (
    AllocationReport,
    ClusterState,
    JobKind,
    JobReport,
    JobState,
    NodeState,
    SchedulerKind,
)

pytestmark = pytest.mark.slow


def jobs_by_id(state: ClusterState) -> dict[str, JobReport]:
    return {job.external_id: job for job in state.jobs}


def nodes_of(row: dict[str, str]) -> list[str]:
    return expand_hostlist(row["nodelist"])


def gpu_indices_from_scontrol(cluster: SlurmCluster, job_id: str) -> dict[str, list[int]]:
    """``Nodes=node[1-2] … GRES=gpu:h100:2(IDX:0-1)`` lines of ``scontrol show job -d``."""
    result: dict[str, list[int]] = {}
    for line in cluster.scontrol_job(job_id).splitlines():
        line = line.strip()
        if line.startswith("Nodes=") and "GRES=" in line:
            nodes = line.split()[0].removeprefix("Nodes=")
            indices = line.split("IDX:", 1)[1].rstrip(")") if "IDX:" in line else ""
            for node in expand_hostlist(nodes):
                result[node] = expand_index_list(indices)
    return result


def test_the_connector_is_registered_and_has_every_capability(slurm: SlurmCluster) -> None:
    connector = registry.create(SchedulerKind.slurm, cluster="hpc-test", slurm_conf=slurm.conf)
    assert isinstance(connector, SlurmConnector)
    for capability in (
        Connector,
        SupportsRequeue,
        SupportsHold,
        SupportsSuspend,
        SupportsCancel,
        SupportsNodeCount,
    ):
        assert isinstance(connector, capability)


def test_nodes_match_the_cluster(slurm: SlurmCluster) -> None:
    state = slurm.connector().read_state()
    assert [node.name for node in state.nodes] == ["node1", "node2", "node3"]
    for node in state.nodes:
        shown = slurm.run("scontrol", "show", "node", node.name)
        assert "Gres=gpu:h100:2" in shown and "CPUTot=4" in shown and "RealMemory=4000" in shown
        assert (node.gpu_model, node.gpu_count, node.cpu_cores, node.memory_mib) == (
            "h100",
            2,
            4,
            4000,
        )
        assert node.labels[LABEL_PARTITIONS] == "debug,high"
        assert node.state is NodeState.up


def test_drained_node_is_reported_draining(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=shaper-test")
    try:
        for connector in (slurm.connector(), slurm.connector(rest_url=slurm.rest_url)):
            nodes = {node.name: node for node in connector.read_state().nodes}
            assert nodes["node2"].state is NodeState.draining
            assert nodes["node1"].state is NodeState.up
    finally:
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")


@pytest.fixture
def known_jobs(slurm: SlurmCluster) -> Iterator[dict[str, str]]:
    """One single-GPU job, a 2-node gang in `high`, one pending for resources, one held."""
    single = slurm.sbatch(
        "--gres=gpu:1",
        "-A",
        "physics",
        "-J",
        "single",
        "--comment=run-7 shaper.io/speeds=h100=2.5,A100-80G=1",
    )
    gang = slurm.sbatch(
        "-N2",
        "--gres=gpu:2",
        "-p",
        "high",
        "-J",
        "gang",
        "--comment=shaper:kind=training,sla=gold,priority=80,checkpointable=true",
    )
    slurm.wait_state(single, "RUNNING")
    slurm.wait_state(gang, "RUNNING")
    waiting = slurm.sbatch("-N3", "--gres=gpu:2", "-J", "waiting")
    held = slurm.sbatch("-H", "--time=90", "--gres=gpu:h100:1", "-J", "shaper:kind=quantization")
    slurm.wait_for(
        "the waiting job to be evaluated", lambda: slurm.job(waiting)["reason"] != "None"
    )
    yield {"single": single, "gang": gang, "waiting": waiting, "held": held}


def test_telemetry_of_known_jobs_matches_slurm(
    slurm: SlurmCluster, known_jobs: dict[str, str]
) -> None:
    jobs = jobs_by_id(slurm.connector().read_state())
    rows = slurm.squeue()

    single = jobs[known_jobs["single"]]
    row = rows[known_jobs["single"]]
    assert single.state is JobState.running and row["state"] == "RUNNING"
    assert single.name == "single" and single.team == "physics" and single.queue == "debug"
    assert (single.gpus_requested, single.gang_size, single.kind) == (1, 1, JobKind.hpc)
    assert [a.node for a in single.allocations] == nodes_of(row)
    assert {a.node: a.gpu_indices for a in single.allocations} == gpu_indices_from_scontrol(
        slurm, known_jobs["single"]
    )
    assert single.submit_time is not None and single.start_time is not None
    # Its own speeds, from a word of its comment (wire.speeds), GRES type as written.
    assert single.speeds == {"h100": 2.5, "A100-80G": 1.0}

    gang = jobs[known_jobs["gang"]]
    row = rows[known_jobs["gang"]]
    assert (gang.state, gang.queue, gang.gang_size, gang.gpus_requested) == (
        JobState.running,
        "high",
        2,
        4,
    )
    assert (gang.kind, gang.sla_class, gang.priority, gang.checkpointable) == (
        JobKind.training,
        "gold",
        80,
        True,
    )
    assert gang.team == "root"  # no account: the user
    assert [a.node for a in gang.allocations] == nodes_of(row)
    assert all(a.gpu_indices == [0, 1] for a in gang.allocations)
    assert {a.node: a.gpu_indices for a in gang.allocations} == gpu_indices_from_scontrol(
        slurm, known_jobs["gang"]
    )

    waiting = jobs[known_jobs["waiting"]]
    assert (waiting.state, waiting.gang_size, waiting.gpus_requested) == (JobState.pending, 3, 6)
    assert waiting.allocations == [] and waiting.start_time is None

    held = jobs[known_jobs["held"]]
    assert held.state is JobState.pending and rows[known_jobs["held"]]["reason"] == "JobHeldUser"
    assert held.allowed_gpu_models == ["h100"] and held.kind is JobKind.quantization
    assert held.time_limit_s == 90 * 60  # --time=90 (minutes)

    # Every GPU Slurm shows in use belongs to exactly one reported allocation.
    used = [(a.node, i) for job in jobs.values() for a in job.allocations for i in a.gpu_indices]
    assert len(used) == len(set(used)) == 5


def test_reason_and_requeue_count_are_read(slurm: SlurmCluster, known_jobs: dict[str, str]) -> None:
    jobs = {job.report.external_id: job for job in slurm.connector().read_jobs()}
    assert jobs[known_jobs["held"]].reason == "JobHeldUser"
    assert jobs[known_jobs["single"]].reason == "None"
    assert jobs[known_jobs["single"]].restart_count == 0
    assert jobs[known_jobs["single"]].account == "physics"


def test_slurmrestd_and_cli_give_the_same_snapshot(
    slurm: SlurmCluster, known_jobs: dict[str, str]
) -> None:
    cli = slurm.connector()
    before = cli.read_state()
    for version in slurm.rest_versions:
        rest = slurm.connector(rest_url=slurm.rest_url, rest_api_version=version)
        assert rest.mode == "rest"
        state = rest.read_state()
        assert state.nodes == before.nodes, version
        assert state.jobs == before.jobs, version
    assert cli.read_state().jobs == before.jobs  # nothing moved while we compared


def test_token_problems_are_clear_errors(slurm: SlurmCluster) -> None:
    token_file = slurm.directory / "token"
    token_file.write_text("")
    rest = slurm.connector(rest_url=slurm.rest_url, rest_token_file=token_file)
    with pytest.raises(ConnectorError, match="token file .* is empty"):
        rest.read_state()
    # A JWT that slurmctld rejects: slurmrestd 22.05 answers 500 as if slurmctld were down,
    # 24.11 511 "Protocol authentication error"; either way the error is retryable (a
    # refresher may replace the file) and says what Slurm said.
    token_file.write_text("not-a-jwt")
    said = "500.*Unspecified error" if slurm.version == "22.05" else "511.*authentication error"
    with pytest.raises(ConnectorError, match=said) as caught:
        rest.read_state()
    assert caught.value.retryable is True
    token_file.write_text(slurm.run("scontrol", "token", "lifespan=60").split("=", 1)[1])
    assert len(rest.read_state().nodes) == 3


def test_an_api_version_slurmrestd_does_not_serve_is_a_clear_error(slurm: SlurmCluster) -> None:
    # The config only accepts known versions; bypass it to ask the real slurmrestd for one.
    config = slurm.config(rest_url=slurm.rest_url).model_copy(
        update={"rest_api_version": "v0.0.39"}
    )
    connector = SlurmConnector(config)
    slurm.connectors.append(connector)
    with pytest.raises(ConnectorError, match=r"does slurmrestd serve v0\.0\.39") as caught:
        connector.read_state()
    assert caught.value.retryable is False


def test_a_missing_cli_is_not_retryable(slurm: SlurmCluster) -> None:
    connector = slurm.connector(bin_dir=slurm.directory / "no-such-bin")
    with pytest.raises(ConnectorError, match="install slurm-client or set bin_dir") as caught:
        connector.read_state()
    assert caught.value.retryable is False


# --- actions -------------------------------------------------------------------------------------


def test_requeue_pinned_to_another_node_runs_the_job_there(slurm: SlurmCluster) -> None:
    connector = slurm.connector()
    job_id = slurm.sbatch("--gres=gpu:2", "-J", "movable")
    source = nodes_of(slurm.wait_state(job_id, "RUNNING"))[0]
    target = next(node for node in ("node1", "node2", "node3") if node != source)

    connector.requeue(job_id, nodes=[target])

    row = slurm.wait_state(job_id, "RUNNING")
    assert nodes_of(row) == [target]
    assert f"ReqNodeList={target}" in slurm.scontrol_job(job_id)
    slurm_job = next(j for j in connector.read_jobs() if j.report.external_id == job_id)
    assert slurm_job.restart_count == 1
    assert slurm_job.report.allocations == [AllocationReport(node=target, gpu_indices=[0, 1])]
    # The source node's GPUs are free again.
    state = connector.read_state()
    assert not [a for job in state.jobs for a in job.allocations if a.node == source]

    # Requeue away from the target (and clear the pin): it runs on neither.
    connector.requeue(job_id, nodes=[], exclude=[target])
    row = slurm.wait_for(
        "the job to run again",
        lambda: (
            (r := slurm.job(job_id))["state"] == "RUNNING"
            and "Restarts=2" in slurm.scontrol_job(job_id)
            and r
        ),
    )
    assert target not in nodes_of(row)
    assert f"ExcNodeList={target}" in slurm.scontrol_job(job_id)


def test_hold_and_release(slurm: SlurmCluster) -> None:
    connector = slurm.connector()
    blocker = slurm.sbatch("-N3", "--gres=gpu:2", "-J", "blocker")
    slurm.wait_state(blocker, "RUNNING")
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "held-later")

    connector.hold(job_id)
    connector.hold(job_id)  # idempotent
    assert slurm.job(job_id)["reason"].startswith("JobHeld")

    connector.cancel(blocker)
    slurm.wait_state(blocker, "CANCELLED")
    slurm.wait_for("the blocker's nodes to be idle", slurm.nodes_idle)
    row = slurm.job(job_id)
    assert row["state"] == "PENDING" and row["reason"].startswith("JobHeld")

    connector.release(job_id)
    slurm.wait_state(job_id, "RUNNING")


def test_suspend_and_resume(slurm: SlurmCluster) -> None:
    connector = slurm.connector()
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "pausable")
    slurm.wait_state(job_id, "RUNNING")

    connector.suspend(job_id)
    connector.suspend(job_id)  # idempotent
    assert slurm.job(job_id)["state"] == "SUSPENDED"
    report = jobs_by_id(connector.read_state())[job_id]
    assert report.state is JobState.suspended
    assert len(report.allocations) == 1  # a suspended job keeps its GPUs

    connector.resume(job_id)
    connector.resume(job_id)  # idempotent
    assert slurm.job(job_id)["state"] == "RUNNING"
    assert jobs_by_id(connector.read_state())[job_id].state is JobState.running


def test_cancel(slurm: SlurmCluster) -> None:
    connector = slurm.connector()
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "doomed")
    slurm.wait_state(job_id, "RUNNING")

    connector.cancel(job_id)
    slurm.wait_state(job_id, "CANCELLED")
    connector.cancel(job_id)  # idempotent on a finished job

    report = jobs_by_id(connector.read_state())[job_id]
    assert report.state is JobState.cancelled and report.allocations == []
    assert report.end_time is not None


def test_update_node_count_of_a_pending_job(slurm: SlurmCluster) -> None:
    connector = slurm.connector()
    blocker = slurm.sbatch("-N3", "--gres=gpu:2", "-J", "blocker")
    slurm.wait_state(blocker, "RUNNING")
    job_id = slurm.sbatch("-N1", "--gres=gpu:1", "-J", "grows")

    connector.update_node_count(job_id, nodes=2)

    report = jobs_by_id(connector.read_state())[job_id]
    assert (report.gang_size, report.gpus_requested) == (2, 2)
    assert slurm.job(job_id)["numnodes"] == "2"
    connector.cancel(blocker)
    row = slurm.wait_state(job_id, "RUNNING")
    assert len(nodes_of(row)) == 2


def test_an_action_on_an_unknown_job_is_not_retryable(slurm: SlurmCluster) -> None:
    with pytest.raises(ConnectorError, match="Invalid job id") as caught:
        slurm.connector().hold("999999")
    assert caught.value.retryable is False
    with pytest.raises(ConnectorError, match="not a Slurm job id"):
        slurm.connector().hold("1; rm -rf /")


# --- the runner through a slurmctld outage -------------------------------------------------------


class RecordingConnector:
    """The real connector, noting each read's outcome in the shared timeline."""

    kind = SchedulerKind.slurm
    cluster = "hpc-a"

    def __init__(self, inner: SlurmConnector, timeline: list[tuple[str, ...]]) -> None:
        self.inner = inner
        self.timeline = timeline

    def read_state(self) -> ClusterState:
        try:
            state = self.inner.read_state()
        except ConnectorError as error:
            self.timeline.append(("read-failed", str(error.retryable)))
            raise
        self.timeline.append(("read",))
        return state


def test_runner_backs_off_while_slurmctld_is_down_then_resyncs(slurm: SlurmCluster) -> None:
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "survivor")
    slurm.wait_state(job_id, "RUNNING")
    timeline: list[tuple[str, ...]] = []
    plane = ControlPlane(cluster="hpc-a")

    def handle(request: httpx.Request) -> httpx.Response:
        response = plane.handle(request)
        last = plane.received[-1]
        timeline.append(("push", last.kind, str(last.seq), str(last.status)))
        return response

    runner = TelemetryRunner(
        RecordingConnector(slurm.connector(), timeline),
        RunnerConfig(
            control_plane="http://control-plane.test",
            cluster="hpc-a",
            token=plane.token,
            interval_s=0.2,
            backoff_initial_s=0.2,
            backoff_max_s=1.0,
        ),
        transport=httpx.MockTransport(handle),
    )
    thread = threading.Thread(target=runner.run, name="telemetry-runner", daemon=True)
    thread.start()
    try:
        slurm.wait_for("two accepted pushes", lambda: len(plane.accepted) >= 2)
        ctld = slurm.pid("slurmctld")
        os.kill(ctld, signal.SIGTERM)
        slurm.wait_for("slurmctld to exit", lambda: not os.path.exists(f"/proc/{ctld}"))
        slurm.wait_for("a failed read", lambda: runner.stats.read_failures >= 1)
        pushes_during_outage = len(plane.received)

        restarted = slurm.script("start")
        assert restarted.returncode == 0, restarted.stderr
        slurm.wait_for(
            "a push after the outage", lambda: len(plane.accepted) > pushes_during_outage + 1
        )
    finally:
        runner.stop()
        thread.join(timeout=30)
        runner.close()
    assert not thread.is_alive()

    first_failure = timeline.index(("read-failed", "True"))
    after = [event for event in timeline[first_failure:] if event[0] == "push"]
    before = [event for event in timeline[:first_failure] if event[0] == "push"]
    # The first push after the outage is a snapshot that continues the sequence.
    assert after[0][1] == "snapshot" and int(after[0][2]) == int(before[-1][2]) + 1
    assert after[0][3] == "200" and after[1][1] == "delta"
    seqs = [int(event[2]) for event in timeline if event[0] == "push"]
    assert seqs == list(range(len(seqs)))
    # Between the first failed read and the resync nothing was pushed: every read in that
    # stretch failed.
    resync_at = timeline.index(after[0])
    stretch = timeline[first_failure:resync_at]
    assert [e for e in stretch if e[0] != "read-failed"] == [("read",)]
    # The job survived slurmctld's restart and is in the resync snapshot, still running.
    snapshot = next(r for r in plane.received if r.kind == "snapshot" and r.seq == int(after[0][2]))
    job = next(j for j in snapshot.body["jobs"] if j["external_id"] == job_id)
    assert job["state"] == "running" and len(job["allocations"]) == 1
    assert sorted(plane.nodes) == ["node1", "node2", "node3"]


class RecordedTransport(httpx.HTTPTransport):
    """slurmrestd's own answers, each request's path noted."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


def test_through_slurmrestd_a_step_reads_its_job_alone(slurm: SlurmCluster) -> None:
    """A step reads its own job (``GET job/{id}``), not the whole queue; a job Slurm no
    longer knows falls back to the whole read, which says so."""
    recorded = RecordedTransport()
    connector = SlurmConnector(slurm.config(rest_url=slurm.rest_url), http_transport=recorded)
    slurm.connectors.append(connector)  # closed when the test ends
    job_id = slurm.sbatch("-H", "--gres=gpu:1", "-J", "alone")

    connector.start(job_id, nodes=["node2"])
    row = slurm.wait_state(job_id, "RUNNING")
    assert nodes_of(row) == ["node2"]
    assert recorded.paths == [f"/slurm/{slurm.rest_api}/job/{job_id}"]

    recorded.paths.clear()
    connector.cancel_moved("999999", key="gone")  # purged: the move stands
    api = slurm.rest_api
    assert recorded.paths == [f"/slurm/{api}/job/999999", f"/slurm/{api}/jobs"]


def test_through_the_cli_a_step_reads_its_job_alone_where_slurm_can(slurm: SlurmCluster) -> None:
    """Slurm 23.11 and later: a step reads its own job (``scontrol show job ID --json``)
    once a read has shown the CLI's version; 22.05, whose ``squeue --json`` ignores ``-j``
    and whose ``scontrol`` has no ``--json``, reads the whole queue. A job scontrol no
    longer knows falls back to the whole read, which says so."""
    recorded = RefusingSlurm(refuses=lambda command: False)  # refuses nothing, records all
    connector = SlurmConnector(slurm.config(), run=recorded)
    slurm.connectors.append(connector)
    connector.read_state()
    job_id = slurm.sbatch("-H", "--gres=gpu:1", "-J", "alone")

    recorded.ran.clear()
    connector.start(job_id, nodes=["node2"])
    assert nodes_of(slurm.wait_state(job_id, "RUNNING")) == ["node2"]
    reads = [command[1:] for _, _, command in recorded.ran if "--json" in command]
    if slurm.version == "22.05":
        assert reads == [["--json", "--states=all"]]
    else:
        assert reads == [["show", "job", job_id, "--json"]]

    recorded.ran.clear()
    connector.cancel_moved("999999", key="gone")  # purged: the move stands
    reads = [command[1:] for _, _, command in recorded.ran if "--json" in command]
    whole = ["--json", "--states=all"]
    alone = [["show", "job", "999999", "--json"]] if slurm.version != "22.05" else []
    assert reads == [*alone, whole]
