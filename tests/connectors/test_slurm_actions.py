"""The connector's action worker: the executor's journal against a fake connector, then the
real thing — `connectors.runner --broker` as its own process on a private Redis, acting on
the real Slurm test cluster (see conftest) and answering on a reply queue of the test's own.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from connectors.actions import ConnectorStepExecutor, StepJournal
from connectors.base import ConnectorError
from connectors.runner import main
from tests.connectors.conftest import REPO, SlurmCluster
from tests.support.pipeline import RedisServer
from wire.steps import Outcome, StepRequest
from wire.telemetry import ClusterState, JobReport, JobState, SchedulerKind

CLUSTER = "hpc-test"
EXECUTOR = f"connector.{CLUSTER}"
TOKEN = "connector-test-token"
REPLY_TASK = "app.actions.tasks.report"
REPLY_WAIT_S = 90.0  # the worker's start on two cores, plus the step itself


# --- the executor, with a fake connector -----------------------------------------------------


class FakeScheduler:
    """Records calls; raises the queued errors first. Only what the executor may use."""

    kind = SchedulerKind.sim
    cluster = CLUSTER

    def __init__(self, *errors: Exception, state: JobState = JobState.pending) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.errors = list(errors)
        self.state = state

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        if self.errors:
            raise self.errors.pop(0)

    def read_state(self) -> ClusterState:
        job = JobReport(external_id="42", state=self.state)
        return ClusterState(observed_at=datetime.now(UTC), nodes=[], jobs=[job])

    def requeue(
        self, external_id: str, *, nodes: list[str] | None = None, exclude: list[str] | None = None
    ) -> None:
        self._call("requeue", external_id, nodes, exclude)

    def hold(self, external_id: str) -> None:
        self._call("hold", external_id)

    def release(self, external_id: str) -> None:
        self._call("release", external_id)

    def suspend(self, external_id: str) -> None:
        self._call("suspend", external_id)

    def resume(self, external_id: str) -> None:
        self._call("resume", external_id)

    def cancel(self, external_id: str) -> None:
        self._call("cancel", external_id)


class NodeSizedScheduler(FakeScheduler):
    def update_node_count(self, external_id: str, *, nodes: int) -> None:
        self._call("update_node_count", external_id, nodes)


_ids = itertools.count(1)


def request(step: str, *, key: str | None = None, **fields: Any) -> StepRequest:
    return StepRequest.model_validate(
        {
            "action_id": 7,
            "key": key or f"a7:forward:{step}:{next(_ids)}",
            "step": step,
            "workload_id": "42",
            "generation": 3,
            **fields,
        }
    )


def test_a_step_runs_once_and_its_key_is_answered_from_the_journal(tmp_path: Path) -> None:
    scheduler = FakeScheduler()
    executor = ConnectorStepExecutor(scheduler, cluster=CLUSTER, state_dir=tmp_path)
    step = request("requeue", args={"nodes": ["node3"], "exclude": ["node1"]})

    first = executor.run(step)
    assert first.ok and first.outcome is Outcome.executed
    assert first.executor == EXECUTOR and first.generation == 3
    assert first.result["nodes"] == ["node3"] and "pinned to node3" in first.result["summary"]

    # A new executor on the same state directory: the answer survived, the step does not rerun.
    again = ConnectorStepExecutor(scheduler, cluster=CLUSTER, state_dir=tmp_path).run(step)
    assert again.outcome is Outcome.duplicate and again.ok
    assert again.result == first.result
    assert scheduler.calls == [("requeue", "42", ["node3"], ["node1"])]


def test_retryable_failures_are_not_remembered_others_are(tmp_path: Path) -> None:
    scheduler = FakeScheduler(
        ConnectorError("slurmctld is down", retryable=True),
        ConnectorError("Invalid job id specified", retryable=False),
    )
    executor = ConnectorStepExecutor(scheduler, cluster=CLUSTER, state_dir=tmp_path)
    step = request("hold")

    down = executor.run(step)
    assert (down.ok, down.retryable, down.outcome) == (False, True, Outcome.executed)
    assert "slurmctld is down" in (down.error or "")
    assert StepJournal(tmp_path).answer(step.key) is None

    invalid = executor.run(step)  # the resend runs again
    assert (invalid.ok, invalid.retryable) == (False, False)
    assert executor.run(step).outcome is Outcome.duplicate  # and is not run a third time
    assert scheduler.calls == [("hold", "42"), ("hold", "42")]


def test_a_crash_is_reported_and_not_remembered(tmp_path: Path) -> None:
    scheduler = FakeScheduler(RuntimeError("boom"))
    executor = ConnectorStepExecutor(scheduler, cluster=CLUSTER, state_dir=tmp_path)
    step = request("suspend")
    crashed = executor.run(step)
    assert (crashed.ok, crashed.retryable) == (False, False) and "boom" in (crashed.error or "")
    assert executor.run(step).outcome is Outcome.executed  # the resend runs again
    assert scheduler.calls == [("suspend", "42"), ("suspend", "42")]


def test_unknown_steps_missing_capabilities_and_stale_generations_are_refused(
    tmp_path: Path,
) -> None:
    scheduler = FakeScheduler()
    executor = ConnectorStepExecutor(scheduler, cluster=CLUSTER, state_dir=tmp_path)

    unknown = executor.run(request("checkpoint"))
    assert (unknown.ok, unknown.outcome, unknown.retryable) == (False, Outcome.refused, False)
    assert "unknown step 'checkpoint'" in (unknown.error or "")

    cannot = executor.run(request("resize", args={"replicas": 2}))
    assert cannot.outcome is Outcome.refused and "cannot resize" in (cannot.error or "")

    assert executor.run(request("hold", generation=5)).ok
    stale = executor.run(request("release", generation=4))
    assert stale.outcome is Outcome.refused and "stale generation 4" in (stale.error or "")

    nameless = executor.run(request("cancel", workload_id=None))
    assert nameless.outcome is Outcome.refused
    assert scheduler.calls == [("hold", "42")]


def test_resize_uses_the_node_count_and_resume_depends_on_the_job_state(tmp_path: Path) -> None:
    sized = NodeSizedScheduler()
    executor = ConnectorStepExecutor(sized, cluster=CLUSTER, state_dir=tmp_path / "a")
    assert executor.run(request("resize", args={"replicas": 2})).ok
    assert executor.run(request("start")).ok
    assert executor.run(request("resume")).ok  # pending (requeued and held): release
    sized.state = JobState.suspended
    assert executor.run(request("resume")).ok
    sized.state = JobState.running
    assert "already runs" in executor.run(request("resume")).result["summary"]
    assert sized.calls == [
        ("update_node_count", "42", 2),
        ("release", "42"),
        ("release", "42"),
        ("resume", "42"),
    ]


def test_a_malformed_message_is_refused_when_it_can_be_answered(tmp_path: Path) -> None:
    executor = ConnectorStepExecutor(FakeScheduler(), cluster=CLUSTER, state_dir=tmp_path)
    report = executor.handle({"action_id": 7, "key": "k", "step": "hold", "generation": -1})
    assert report is not None and report.outcome is Outcome.refused
    assert executor.handle({"step": "hold"}) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--actions-only"], "--actions-only needs --broker"),
        (["--broker=redis://127.0.0.1:9/0"], "--control-plane is required"),
    ],
)
def test_main_refuses_modes_that_cannot_work(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("SHAPER_BROKER_URL", raising=False)
    with pytest.raises(SystemExit) as caught:
        main(["--kind=slurm", "--cluster=hpc-a", "--token=t", *argv])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


# --- the real worker, real Redis, real Slurm ---------------------------------------------------


@dataclass
class ConnectorWorker:
    broker: str
    process: subprocess.Popen[bytes]
    log: Path
    state_dir: Path
    client: Celery

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def send(
        self, step: str, job_id: str, *, key: str | None = None, task: str = "", **args: Any
    ) -> str:
        """Send one step as the saga does; the reply queue is the key's own."""
        key = key or f"test:{uuid.uuid4().hex}"
        with Connection(self.broker) as connection:
            connection.SimpleQueue(reply_queue(key)).close()  # declared before any reply
        self.client.send_task(
            f"shaper.connector.{task or step}",
            kwargs={
                "step": {
                    "action_id": 1,
                    "key": key,
                    "step": step,
                    "phase": "forward",
                    "workload_id": job_id,
                    "generation": 1,
                    "args": {"source_node": None, "target_node": None, "replicas": 0, **args},
                    "reply_task": REPLY_TASK,
                    "reply_queue": reply_queue(key),
                }
            },
            queue=EXECUTOR,
        )
        return key

    def reply(self, key: str) -> dict[str, Any]:
        """The one task message the worker sent to the key's reply queue: its kwargs."""
        deadline = time.monotonic() + REPLY_WAIT_S
        with Connection(self.broker) as connection:
            queue = connection.SimpleQueue(reply_queue(key))
            try:
                while True:
                    assert self.process.poll() is None, f"the worker died:\n{self.tail()}"
                    try:
                        message = queue.get(timeout=1)
                    except queue.Empty:
                        if time.monotonic() > deadline:
                            raise AssertionError(
                                f"no reply for {key} after {REPLY_WAIT_S} s:\n{self.tail()}"
                            ) from None
                        continue
                    message.ack()
                    assert message.headers["task"] == REPLY_TASK
                    args, kwargs, _embed = message.payload
                    assert args == [] and kwargs["token"] == TOKEN
                    return kwargs["report"]
            finally:
                queue.close()

    def step(self, step: str, job_id: str, **fields: Any) -> dict[str, Any]:
        return self.reply(self.send(step, job_id, **fields))


def reply_queue(key: str) -> str:
    return "reply." + re.sub(r"[^A-Za-z0-9.]", ".", key)


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def connector_worker(
    slurm_cluster: SlurmCluster, root: Path, *options: str
) -> Iterator[ConnectorWorker]:
    """`python -m connectors.runner … --broker` as its own process, with its own Redis."""
    redis = RedisServer(root)
    redis.start()
    log = root / "connector.log"
    state_dir = root / "state"
    command = [
        sys.executable,
        "-m",
        "connectors.runner",
        "--kind=slurm",
        f"--cluster={CLUSTER}",
        f"--token={TOKEN}",
        f"--broker={redis.url}",
        f"--state-dir={state_dir}",
        "--set",
        f"slurm_conf={slurm_cluster.conf}",
        *options,
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHAPER_")}
    with open(log, "wb") as stream:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = Celery("connector-test-client", broker=redis.url, set_as_current=False)
    try:
        yield ConnectorWorker(redis.url, process, log, state_dir, client)
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        redis.stop()


@pytest.fixture(scope="module")
def worker(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectorWorker]:
    # Telemetry goes to a port nobody listens on: it retries there, and actions go on.
    control_plane = f"--control-plane=http://127.0.0.1:{unused_port()}"
    root = tmp_path_factory.mktemp("connector-actions")
    with connector_worker(slurm_cluster, root, control_plane) as running:
        yield running


def restarts(slurm: SlurmCluster, job_id: str) -> int:
    match = re.search(r"\bRestarts=(\d+)", slurm.scontrol_job(job_id))
    assert match, slurm.scontrol_job(job_id)
    return int(match.group(1))


def nodes_of(row: dict[str, Any]) -> str:
    return row["nodelist"]


@pytest.mark.slow
def test_requeue_pins_the_job_and_a_resent_key_is_answered_without_requeueing(
    slurm: SlurmCluster, worker: ConnectorWorker
) -> None:
    job_id = slurm.sbatch("--gres=gpu:1", "-w", "node1", "-J", "movable")
    slurm.wait_state(job_id, "RUNNING")

    key = worker.send("requeue", job_id, nodes=["node3"])
    report = worker.reply(key)

    assert report["ok"] is True, report
    assert report["outcome"] == "executed" and report["executor"] == EXECUTOR
    assert report["key"] == key and report["action_id"] == 1 and report["error"] is None
    assert "requeued job" in report["result"]["summary"]
    assert "ReqNodeList=node3" in slurm.scontrol_job(job_id)
    row = slurm.wait_state(job_id, "RUNNING")  # after cred_expire (5 s)
    assert nodes_of(row) == "node3"
    assert restarts(slurm, job_id) == 1

    # The control plane resends the step (its answer was lost): answered from the journal.
    worker.send("requeue", job_id, key=key, nodes=["node3"])
    again = worker.reply(key)
    assert again["outcome"] == "duplicate" and again["ok"] is True
    assert again["result"] == report["result"]
    time.sleep(2)  # a requeue would show at once
    assert restarts(slurm, job_id) == 1
    assert slurm.job(job_id)["state"] == "RUNNING"

    # Telemetry could not reach its control plane all along; the actions did not mind.
    log = worker.tail()
    assert f"serving slurm action steps on queue {EXECUTOR}" in log
    assert "control plane unreachable" in log


@pytest.mark.slow
def test_a_requeue_resent_after_its_answer_was_lost_does_not_requeue_again(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The connector died after requeueing the job but before journalling its answer: the
    control plane's resend reaches a connector with no memory of the step. The requeue
    stamped the job's AdminComment with its key, so the resend finds it and leaves the job
    running where it went, instead of restarting it (and its work) a second time."""
    job_id = slurm.sbatch("--gres=gpu:1", "-w", "node1", "-J", "stamped")
    slurm.wait_state(job_id, "RUNNING")
    request = StepRequest(
        action_id=7, key=f"requeue:{uuid.uuid4().hex[:8]}", step="requeue",
        workload_id=job_id, args={"nodes": ["node3"]},
    )  # fmt: skip
    first = ConnectorStepExecutor(slurm.connector(), cluster="hpc-test", state_dir=tmp_path / "a")
    report = first.run(request)
    assert report.ok, report.error
    assert f"AdminComment=shaper-step:{request.key}" in slurm.scontrol_job(job_id)
    row = slurm.wait_state(job_id, "RUNNING")  # after cred_expire (5 s)
    assert nodes_of(row) == "node3" and restarts(slurm, job_id) == 1

    amnesiac = ConnectorStepExecutor(
        slurm.connector(), cluster="hpc-test", state_dir=tmp_path / "after-a-crash"
    )
    resent = amnesiac.run(request)
    assert resent.ok and resent.outcome is Outcome.executed, resent.error
    time.sleep(2)  # a requeue would show at once
    assert restarts(slurm, job_id) == 1
    assert slurm.job(job_id)["state"] == "RUNNING" and nodes_of(slurm.job(job_id)) == "node3"

    # A new step (its own key) does requeue it: the stamp is per step, not per job.
    again = amnesiac.run(request.model_copy(update={"key": f"requeue:{uuid.uuid4().hex[:8]}"}))
    assert again.ok, again.error
    assert restarts(slurm, job_id) == 2


@pytest.mark.slow
def test_a_requeue_resent_after_it_stopped_short_of_the_release_releases_the_job(
    slurm: SlurmCluster,
) -> None:
    """The first delivery requeued and held the job, then died (or its release timed out)
    before letting it go: the resend, finding its stamp and the restart it caused, does
    not requeue again and does not leave the job held — it releases it."""
    job_id = slurm.sbatch("--gres=gpu:1", "-w", "node2", "-J", "half-done")
    slurm.wait_state(job_id, "RUNNING")
    connector = slurm.connector()
    connector.set_step_key(job_id, "restart-7")
    # Stopped short of the release: the same as a requeue that was told to hold.
    connector.requeue(job_id, hold=True)
    assert "AdminComment=shaper-step:restart-7:0" in slurm.scontrol_job(job_id)
    assert restarts(slurm, job_id) == 1
    assert "Priority=0" in slurm.scontrol_job(job_id)

    resend = slurm.connector()
    resend.set_step_key(job_id, "restart-7")
    resend.requeue(job_id)
    slurm.wait_state(job_id, "RUNNING")  # released, and runs after cred_expire
    assert restarts(slurm, job_id) == 1


@pytest.mark.slow
def test_cancel_and_refusals(slurm: SlurmCluster, worker: ConnectorWorker) -> None:
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "doomed")
    slurm.wait_state(job_id, "RUNNING")

    cancelled = worker.step("cancel", job_id)
    assert cancelled["ok"] is True and cancelled["executor"] == EXECUTOR, cancelled
    slurm.wait_for(
        "the job to be cancelled",
        lambda: slurm.squeue().get(job_id, {"state": "CANCELLED"})["state"] == "CANCELLED",
    )

    not_slurm = worker.step("requeue", "job-42", nodes=["node3"])
    assert (not_slurm["ok"], not_slurm["retryable"]) == (False, False), not_slurm
    assert "not a Slurm job id" in not_slurm["error"]

    # Under a registered task name: an unregistered one never reaches the executor.
    unknown = worker.step("reprioritize", job_id, task="hold")
    assert unknown["outcome"] == "refused" and unknown["retryable"] is False
    assert "unknown step" in unknown["error"]


@pytest.mark.slow
@pytest.mark.parametrize("telemetry", [False, True], ids=["actions-only", "with-telemetry"])
def test_hold_and_start_then_sigterm_stops_the_process(
    slurm: SlurmCluster, tmp_path: Path, telemetry: bool
) -> None:
    blocker = slurm.sbatch("-N3", "--gres=gpu:2", "-J", "blocker")
    slurm.wait_state(blocker, "RUNNING")
    job_id = slurm.sbatch("--gres=gpu:1", "-J", "waits")
    mode = f"--control-plane=http://127.0.0.1:{unused_port()}" if telemetry else "--actions-only"

    with connector_worker(slurm, tmp_path, mode) as running:
        held = running.step("hold", job_id)
        assert held["ok"] is True, held
        slurm.wait_for(
            "the job to be held", lambda: slurm.job(job_id)["reason"].startswith("JobHeld")
        )
        started = running.step("start", job_id)
        assert (
            started["ok"] is True
            and f"asked the scheduler to start job {job_id}" in started["result"]["summary"]
        ), started
        slurm.wait_for(
            "the hold to go", lambda: not slurm.job(job_id)["reason"].startswith("JobHeld")
        )

        # A warm shutdown of the worker, and the telemetry thread (stuck retrying) with it.
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0, running.tail()
        log = running.tail()
        if telemetry:
            assert "pushing telemetry to http://127.0.0.1:" in log
        else:
            assert "no telemetry (--actions-only)" in log
            assert "control plane unreachable" not in log
