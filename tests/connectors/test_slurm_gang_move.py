"""A gang's move on a real Slurm (app.actions.recipes: a job on several nodes moves whole
by a restart pinned to its new nodes, from its own checkpoint): the ``requeue`` (held,
pinned), ``start`` and ``confirm`` steps of such a migrate run by the connector's step
executor against Slurm itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from connectors.actions import ConnectorStepExecutor
from tests.connectors.conftest import SlurmCluster
from tests.connectors.test_slurm_elastic import CLUSTER, _confirmed, _restarts, _step

pytestmark = pytest.mark.slow

RIGID = "--comment=shaper:kind=training,checkpointable=true"
SLOW_TO_STOP = "trap 'sleep 5' TERM; sleep 600 & wait"


def test_a_gang_moves_whole_by_a_requeue_held_and_a_start_pinned_to_its_new_nodes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # It takes its time to stop (as a job writing its checkpoint on SIGTERM does), so Slurm
    # shows it completing on node1-node2 for a while after the requeue.
    job_id = slurm.sbatch(
        "--nodes=2", "--gres=gpu:h100:2", "-w", "node1,node2", RIGID, command=SLOW_TO_STOP
    )
    slurm.wait_state(job_id, "RUNNING")
    executor = ConnectorStepExecutor(slurm.connector(), cluster=CLUSTER, state_dir=tmp_path)
    target = ["node2", "node3"]

    key = "a8:forward:requeue"
    requeue = _step(executor, "requeue", job_id, key=key, nodes=target, hold=True)
    assert requeue["ok"] is True, requeue
    # Held, it waits for the start: the saga sends it as soon as the requeue is answered,
    # while Slurm may still show the job completing on its old nodes (a job writing its
    # checkpoint as it stops, an epilog): the start must pin and release it all the same.
    assert "Priority=0 " in slurm.scontrol_job(job_id)
    start = _step(executor, "start", job_id, nodes=target)
    assert start["ok"] is True, start
    confirmed = _confirmed(executor, job_id, target)
    assert confirmed["ok"] is True, (confirmed["error"], slurm.scontrol_job(job_id))
    assert slurm.job(job_id)["nodelist"] == "node[2-3]" and _restarts(slurm, job_id) == 1
    assert slurm.job(job_id)["numnodes"] == "2"
    # The requeue resent late with its key, its journal lost (another connector process):
    # the job's stamp says this step requeued it already; it is not stopped again.
    fresh = ConnectorStepExecutor(slurm.connector(), cluster=CLUSTER, state_dir=tmp_path / "new")
    again = _step(fresh, "requeue", job_id, key=key, nodes=target, hold=True)
    assert again["ok"] is True, again
    time.sleep(2)
    assert _restarts(slurm, job_id) == 1 and slurm.job(job_id)["state"] == "RUNNING"
    # Its confirm fails while it runs anywhere but the nodes planned.
    stale = _step(
        executor, "confirm", job_id, expect="running", nodes=["node1", "node2"], exactly=True
    )
    assert stale["ok"] is False and "expected running on node1,node2 only" in stale["error"]
