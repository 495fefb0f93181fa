"""Elastic training jobs on a real Slurm: what the connector reports of a job whose node
count may change (``sbatch --nodes=MIN-MAX``, the tag ``shaper:nodes=MIN-MAX``), and the
``resize`` and ``confirm`` steps of its resize run by the connector's step executor
against Slurm itself (connectors.slurm.connector.SlurmConnector.resize_job)."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.slurm.hostlist import expand_hostlist
from tests.connectors.conftest import SlurmCluster
from wire.steps import StepRequest
from wire.telemetry import JobReport

pytestmark = pytest.mark.slow

CLUSTER = "hpc-test"
TAG = "--comment=shaper:kind=training,nodes=1-3,checkpointable=true"
_ids = itertools.count(1)


def _reports(slurm: SlurmCluster) -> dict[str, JobReport]:
    connector = slurm.connector()
    return {job.external_id: job for job in connector.read_state().jobs}


def _restarts(slurm: SlurmCluster, job_id: str) -> int:
    match = re.search(r"\bRestarts=(\d+)", slurm.scontrol_job(job_id))
    assert match, slurm.scontrol_job(job_id)
    return int(match.group(1))


def _step(
    executor: ConnectorStepExecutor, step: str, job_id: str, key: str | None = None, **args: Any
) -> dict[str, Any]:
    request = StepRequest.model_validate(
        {
            "action_id": 7,
            "key": key or f"a7:forward:{step}:{next(_ids)}",
            "step": step,
            "workload_id": job_id,
            "generation": 1,
            "args": args,
        }
    )
    return executor.run(request).model_dump(mode="json")


def _running(
    slurm: SlurmCluster, state_dir: Path, *options: str
) -> tuple[str, ConnectorStepExecutor]:
    """A job submitted with ``options``, once it runs, and a step executor over a connector."""
    job_id = slurm.sbatch(*options)
    slurm.wait_state(job_id, "RUNNING")
    return job_id, ConnectorStepExecutor(slurm.connector(), cluster=CLUSTER, state_dir=state_dir)


def _confirmed(executor: ConnectorStepExecutor, job_id: str, nodes: list[str]) -> dict[str, Any]:
    """Polls the resize's confirm (running on ``nodes`` only) as the saga does."""
    deadline = time.monotonic() + 30
    while True:
        report = _step(executor, "confirm", job_id, expect="running", nodes=nodes, exactly=True)
        if report["ok"] or time.monotonic() > deadline:
            return report
        time.sleep(0.5)


def test_a_jobs_node_range_is_reported_while_it_waits_and_by_its_tag_while_it_runs(
    slurm: SlurmCluster,
) -> None:
    tagged = slurm.sbatch("--nodes=2", "--gres=gpu:h100:2", TAG)
    slurm.wait_state(tagged, "RUNNING")
    waiting = slurm.sbatch("--nodes=1-3", "--gres=gpu:h100:2", "-H")
    plain = slurm.sbatch("--gres=gpu:h100:1", "-H")
    jobs = _reports(slurm)
    # Running, by its tag: 2 nodes of 2 GPUs now, 1 to 3 of them, asking for 3.
    assert (jobs[tagged].state.value, jobs[tagged].gang_size, jobs[tagged].gpus_requested) == (
        "running",
        2,
        4,
    )
    assert (jobs[tagged].min_replicas, jobs[tagged].max_replicas, jobs[tagged].replicas) == (
        1,
        3,
        3,
    )
    # Waiting with a range Slurm was given (sbatch --nodes=1-3): the same, from Slurm.
    assert (jobs[waiting].min_replicas, jobs[waiting].max_replicas, jobs[waiting].replicas) == (
        1,
        3,
        3,
    )
    assert jobs[waiting].gpus_requested == 2 and jobs[waiting].gang_size == 1
    assert (jobs[plain].min_replicas, jobs[plain].max_replicas) == (0, 0)
    # Started, the untagged one's range is gone from Slurm (the control plane keeps it).
    slurm.run("scancel", tagged)
    slurm.wait_for("the tagged job to end", lambda: slurm.job(tagged)["state"] == "CANCELLED")
    slurm.run("scontrol", "release", waiting)
    slurm.wait_state(waiting, "RUNNING")
    started = _reports(slurm)[waiting]
    assert started.gang_size == 3 and started.max_replicas == 0


def test_a_running_job_shrinks_where_it_runs_without_a_restart(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job_id, executor = _running(slurm, tmp_path, "--nodes=3", "--gres=gpu:h100:2", TAG)

    report = _step(executor, "resize", job_id, nodes=["node1", "node3"], replicas=2)
    assert report["ok"] is True, report
    assert report["result"]["nodes"] == ["node1", "node3"]
    confirmed = _confirmed(executor, job_id, ["node1", "node3"])
    assert confirmed["ok"] is True, confirmed
    assert slurm.job(job_id)["nodelist"] == "node[1,3]" and slurm.job(job_id)["numnodes"] == "2"
    assert _restarts(slurm, job_id) == 0  # shrunk in place: not requeued
    # node2 is Slurm's again: a job asking for it runs.
    other = slurm.sbatch("--gres=gpu:h100:2", "-w", "node2")
    slurm.wait_state(other, "RUNNING")
    # A resend (a new key: the journal has not seen it) finds it done.
    again = _step(executor, "resize", job_id, nodes=["node1", "node3"], replicas=2)
    assert again["ok"] is True and _restarts(slurm, job_id) == 0
    # The confirm of a resize fails while the job runs anywhere else too.
    stale = _step(executor, "confirm", job_id, expect="running", nodes=["node1"], exactly=True)
    assert stale["ok"] is False and "expected running on node1 only" in stale["error"]


def test_a_running_job_grows_by_a_restart_on_the_nodes_planned_and_a_resend_does_not_restart_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job_id, executor = _running(
        slurm, tmp_path, "--nodes=1", "--gres=gpu:h100:2", "-w", "node2", TAG
    )
    nodes = ["node1", "node2", "node3"]

    key = "a7:forward:resize"
    report = _step(executor, "resize", job_id, key=key, nodes=nodes, replicas=3)
    assert report["ok"] is True, report
    confirmed = _confirmed(executor, job_id, nodes)  # after cred_expire (5 s)
    assert confirmed["ok"] is True, (confirmed["error"], slurm.scontrol_job(job_id))
    assert slurm.job(job_id)["nodelist"] == "node[1-3]" and _restarts(slurm, job_id) == 1
    # Its range is kept by its tag; Slurm's own count is now the planned one.
    assert _reports(slurm)[job_id].max_replicas == 3
    assert "NumNodes=3" in slurm.scontrol_job(job_id)
    # The step resent with its key, its journal lost (another connector process): the
    # stamp on the job tells that the restart happened; it is not requeued again.
    fresh = ConnectorStepExecutor(slurm.connector(), cluster=CLUSTER, state_dir=tmp_path / "new")
    again = _step(fresh, "resize", job_id, key=key, nodes=nodes, replicas=3)
    assert again["ok"] is True, again
    time.sleep(2)
    assert _restarts(slurm, job_id) == 1 and slurm.job(job_id)["state"] == "RUNNING"


def test_a_pending_elastic_job_starts_at_the_size_it_was_planned_at(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = ConnectorStepExecutor(slurm.connector(), cluster=CLUSTER, state_dir=tmp_path)
    ranged = slurm.sbatch("--nodes=1-3", "--gres=gpu:h100:2", "-H")
    report = _step(executor, "start", ranged, nodes=["node2"], replicas=1)
    assert report["ok"] is True, report
    row = slurm.wait_state(ranged, "RUNNING")
    # Released without its size, Slurm would have given it all three idle nodes.
    assert row["nodelist"] == "node2" and row["numnodes"] == "1"
    slurm.run("scancel", ranged)
    slurm.wait_for("node2 to be idle", slurm.nodes_idle)
    # A job Shaper sized before (NumNodes=3-3: Slurm no longer reports its range, the
    # control plane keeps it) is sized again by the start's replicas, not left at 3.
    resized = slurm.sbatch("--nodes=3", "--gres=gpu:h100:2", "-H")
    report = _step(executor, "start", resized, nodes=["node2", "node3"], replicas=2)
    assert report["ok"] is True, report
    row = slurm.wait_state(resized, "RUNNING")
    assert row["nodelist"] == "node[2-3]" and row["numnodes"] == "2"


def test_two_replicas_planned_on_one_node_run_on_as_many_nodes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The solver may put two replicas on one node; Slurm runs one per node. The job keeps
    the planned node and as many of its others as the size needs."""
    job_id, executor = _running(slurm, tmp_path, "--nodes=3", "--gres=gpu:h100:2", TAG)
    report = _step(executor, "resize", job_id, nodes=["node2"], replicas=2)
    assert report["ok"] is True, report
    confirmed = _step(
        executor, "confirm", job_id, expect="running", nodes=["node2"], exactly=True, replicas=2
    )
    assert confirmed["ok"] is True, confirmed
    row = slurm.job(job_id)
    assert row["numnodes"] == "2" and "node2" in expand_hostlist(row["nodelist"])
    assert _restarts(slurm, job_id) == 0
    # The confirm counts nodes too: at most as many as replicas.
    over = _step(
        executor, "confirm", job_id, expect="running", nodes=["node2"], exactly=True, replicas=1
    )
    assert over["ok"] is False and "expected running on node2 only" in over["error"]


def test_a_plan_slurm_cannot_carry_out_is_refused_and_changes_nothing(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job_id, executor = _running(slurm, tmp_path, "--nodes=2", "--gres=gpu:h100:2", TAG)
    # Two replicas on three nodes.
    report = _step(executor, "resize", job_id, nodes=["node1", "node2", "node3"], replicas=2)
    assert report["ok"] is False and report["outcome"] == "executed", report
    assert "2 replica(s) cannot run on 3 node(s)" in report["error"]
    assert slurm.job(job_id)["numnodes"] == "2" and _restarts(slurm, job_id) == 0
    ended = slurm.sbatch("--gres=gpu:h100:1", "-H")
    slurm.run("scancel", ended)
    slurm.wait_for("the job to end", lambda: slurm.job(ended)["state"] == "CANCELLED")
    refused = _step(executor, "resize", ended, nodes=["node3"], replicas=1)
    assert refused["ok"] is False and "the job is CANCELLED" in refused["error"]
