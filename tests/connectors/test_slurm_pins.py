"""Shaper's pins on a real Slurm last one run (connectors.slurm.stamps): a job a plan
started on chosen nodes (``ReqNodeList``, which Slurm keeps for good) and that Slurm then
requeues — its node drained and the job requeued, as a failure or a higher partition's
preemption does — is given its own node list back by the connector's next read, so that it
runs elsewhere instead of waiting for the nodes Shaper once chose."""

from __future__ import annotations

import re

import pytest

from connectors.slurm.connector import SlurmConnector
from tests.connectors.conftest import SlurmCluster

pytestmark = pytest.mark.slow

TRAINING = "--comment=shaper:kind=training,checkpointable=true"


def _field(slurm: SlurmCluster, job_id: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S*)", slurm.scontrol_job(job_id))
    assert found, slurm.scontrol_job(job_id)
    return found.group(1)


def _requeued_off(slurm: SlurmCluster, job_id: str, node: str) -> None:
    """The job requeued by someone else than Shaper, its node drained."""
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=shaper-test")
    slurm.run("scontrol", "requeue", job_id)
    slurm.wait_for("the job pending again", lambda: slurm.job(job_id)["state"] == "PENDING")


def _admin_comment(connector: SlurmConnector, job_id: str) -> str:
    return next(j.admin_comment for j in connector.read_jobs() if j.report.external_id == job_id)


@pytest.fixture
def node2_back(slurm: SlurmCluster):
    yield
    if "drain" in slurm.run("sinfo", "-h", "-n", "node2", "-o", "%t"):
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")


def test_a_job_requeued_after_shapers_start_is_no_longer_held_to_its_nodes(
    slurm: SlurmCluster, node2_back: None
) -> None:
    # Its name mimics the field the stamps live in: the connector reads Slurm's JSON, not
    # scontrol's line, which starts with the name.
    job_id = slurm.sbatch(
        "--hold", "--requeue", "--gres=gpu:h100:1", "--job-name=x AdminComment=free", TRAINING
    )
    connector = slurm.connector()
    connector.start(job_id, nodes=["node2"])
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] == "node2"
    assert _admin_comment(connector, job_id) == "shaper-pin:0::node2"
    # Slurm keeps the pin while the job runs, and refuses to change it then.
    assert _field(slurm, job_id, "ReqNodeList") == "node2"

    _requeued_off(slurm, job_id, "node2")
    # Without the stamp this job waits for node2 for good (ReqNodeNotAvail), and Shaper's
    # snapshot, reading ReqNodeList as a job's required nodes, would plan it nowhere else.
    report = next(j for j in connector.read_state().jobs if j.external_id == job_id)
    assert report.required_nodes == []
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] in ("node1", "node3")
    assert _field(slurm, job_id, "ReqNodeList") == "(null)"
    assert _admin_comment(connector, job_id) == ""


def test_the_job_gets_back_the_nodes_it_asked_for_itself(
    slurm: SlurmCluster, node2_back: None
) -> None:
    job_id = slurm.sbatch("--hold", "--requeue", "--gres=gpu:h100:1", "-w", "node1", TRAINING)
    connector = slurm.connector()
    connector.start(job_id, nodes=["node2"])
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] == "node2"

    _requeued_off(slurm, job_id, "node2")
    report = next(j for j in connector.read_state().jobs if j.external_id == job_id)
    assert report.required_nodes == ["node1"]
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] == "node1"
    assert _field(slurm, job_id, "ReqNodeList") == "node1"


def test_a_pin_for_the_run_to_come_stays_and_a_steps_stamp_is_kept_beside_it(
    slurm: SlurmCluster, node2_back: None
) -> None:
    job_id = slurm.sbatch("--requeue", "--gres=gpu:h100:1", "-w", "node1", TRAINING)
    slurm.wait_state(job_id, "RUNNING")
    connector = slurm.connector()
    # A plan's requeue, keyed and pinned: its stamp and the pin's share the AdminComment.
    connector.set_step_key(job_id, "a9:forward:requeue")
    connector.requeue(job_id, nodes=["node2"], hold=True)
    assert _field(slurm, job_id, "AdminComment") == (
        "shaper-step:a9:forward:requeue:0;shaper-pin:1:node1:node2"
    )
    # Pending, held, pinned for the run it is requeued for: not lifted.
    report = next(j for j in connector.read_state().jobs if j.external_id == job_id)
    assert report.required_nodes == ["node2"]
    connector.start(job_id, nodes=["node2"])
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] == "node2"

    _requeued_off(slurm, job_id, "node2")
    # A plan's start that comes before the connector's read pins it for this run anew.
    connector.start(job_id, nodes=["node3"])
    assert _field(slurm, job_id, "AdminComment") == (
        "shaper-step:a9:forward:requeue:0;shaper-pin:2:node1:node3"
    )
    report = next(j for j in connector.read_state().jobs if j.external_id == job_id)
    assert report.required_nodes == ["node3"]
    slurm.wait_state(job_id, "RUNNING")
    assert slurm.job(job_id)["nodelist"] == "node3"


def test_an_operators_edit_since_stays_and_a_list_slurm_refuses_is_cleared(
    slurm: SlurmCluster, node2_back: None
) -> None:
    edited = slurm.sbatch("--hold", "--requeue", "--gres=gpu:h100:1", TRAINING)
    gone = slurm.sbatch("--hold", "--requeue", "--gres=gpu:h100:1", TRAINING)
    connector = slurm.connector()
    for job_id in (edited, gone):
        connector.start(job_id, nodes=["node2"])
        slurm.wait_state(job_id, "RUNNING")
    # Its own list before Shaper's pin names a node Slurm no longer has (removed from
    # slurm.conf since): as the stamp would say for a job submitted with -w nodeX.
    slurm.run("scontrol", "update", f"JobId={gone}", "AdminComment=shaper-pin:0:node9:node2")
    slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=shaper-test")
    for job_id in (edited, gone):
        slurm.run("scontrol", "hold", job_id)  # held pending: it waits for the checks below
        slurm.run("scontrol", "requeue", job_id)
    slurm.wait_for(
        "both pending", lambda: all(slurm.job(j)["state"] == "PENDING" for j in (edited, gone))
    )
    slurm.run("scontrol", "update", f"JobId={edited}", "ReqNodeList=node3")

    reports = {j.external_id: j for j in connector.read_state().jobs}
    assert reports[edited].required_nodes == ["node3"]
    assert _field(slurm, edited, "ReqNodeList") == "node3"
    assert _admin_comment(connector, edited) == "shaper-pin:0::node2"
    assert reports[gone].required_nodes == []  # node9 is what it asked, but Slurm has none
    assert _field(slurm, gone, "ReqNodeList") == "(null)"
    assert _admin_comment(connector, gone) == ""
