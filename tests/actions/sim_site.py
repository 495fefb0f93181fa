"""A simulated cluster served over Celery, as a deployed connector and its node agents
serve a real one: one worker on ``connector.<cluster>`` and ``agent.<cluster>.<node>``
whose steps are answered by connectors.sim's SimExecutors against one SimCluster.

    SHAPER_SIM_SITE=simlab SHAPER_SIM_SITE_STATE=state.json SHAPER_SIM_SITE_TOKENS='{...}' \\
        celery -A tests.actions.sim_site worker -Q connector.simlab,agent.simlab.a,agent.simlab.b

The cluster starts fragmented (see ``fragment``). After every step it writes what its
scheduler reports (``ClusterState`` JSON, with its reservations) to the state file, which
the test pushes to the control plane as telemetry. ``SHAPER_SIM_SITE_RIVAL_AFTER=<step>``
submits a rival job, which strict FIFO would put first, right after that step succeeds:
the worst moment for the plan.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery

from connectors.sim import SimCluster, SimExecutors, SiteSpec
from connectors.sim.cluster import utc_now
from wire.executor import REPLY_RETRY
from wire.queues import (
    CONTROL_QUEUE,
    REPLY_TASK,
    agent_queue_prefix,
    connector_queue,
    executor_scope,
    step_task,
)
from wire.telemetry import JobKind, JobReport

CLUSTER = os.environ.get("SHAPER_SIM_SITE", "simlab")
STATE = Path(os.environ.get("SHAPER_SIM_SITE_STATE", "sim-site-state.json"))
TOKENS: dict[str, str] = json.loads(os.environ.get("SHAPER_SIM_SITE_TOKENS", "{}"))
RIVAL_AFTER = os.environ.get("SHAPER_SIM_SITE_RIVAL_AFTER", "")
STEPS = (
    "checkpoint",
    "transfer",
    "stage",
    "restore",
    "confirm",
    "release",
    "start",
    "resume",
    "requeue",
    "resize",
    "reserve",
    "unreserve",
)


def report(job_id: str, gpus: int, submitted: datetime, priority: int = 10) -> JobReport:
    return JobReport(
        external_id=job_id,
        team="research",
        kind=JobKind.training,
        gpus_requested=gpus,
        checkpointable=True,
        priority=priority,
        submit_time=submitted,
    )


def fragment(cluster: SimCluster, now: datetime) -> None:
    """Two 8-GPU nodes, each half held by a checkpointable job; an 8-GPU job waits."""
    cluster.submit(report("left", 4, now - timedelta(minutes=30)), timedelta(hours=4))
    cluster.submit(report("right", 4, now - timedelta(minutes=30)), timedelta(hours=4))
    cluster.requeue("right", nodes=["b"])
    cluster.submit(report("big", 8, now, priority=50), timedelta(hours=2))


def write_state(cluster: SimCluster) -> None:
    state = cluster.read_state().model_dump(mode="json")
    state["reservations"] = cluster.reservations
    temporary = STATE.with_suffix(".tmp")
    temporary.write_text(json.dumps(state))
    os.replace(temporary, STATE)


spec = SiteSpec(
    name=CLUSTER,
    nodes=(("a", "H100", 8), ("b", "H100", 8)),
    teams=("research",),
    kinds=(JobKind.training,),
    arrivals_per_hour=0,
)
cluster = SimCluster(spec, start=utc_now(), seed=1, clock=utc_now)
fragment(cluster, utc_now())
executors = SimExecutors(cluster, state_dir=STATE.parent / f"{CLUSTER}-executors")
write_state(cluster)

app = Celery(f"sim-site-{CLUSTER}", broker=os.environ["SHAPER_BROKER_URL"], set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    timezone="UTC",
)


def _run(task: Any, step: dict[str, Any]) -> None:
    queue = str(task.request.delivery_info.get("routing_key") or "")
    answer = executors.handle(queue, step)
    if answer["ok"] and RIVAL_AFTER and step.get("step") == RIVAL_AFTER:
        at = datetime.now(UTC)
        cluster.submit(report("rival", 4, at - timedelta(hours=1)), timedelta(hours=1))
    write_state(cluster)
    app.send_task(
        str(step.get("reply_task") or REPLY_TASK),
        kwargs={"report": answer, "token": TOKENS[executor_scope(queue)]},
        queue=str(step.get("reply_queue") or CONTROL_QUEUE),
        retry=True,
        retry_policy=REPLY_RETRY,
    )


for _queue in (agent_queue_prefix(CLUSTER), connector_queue(CLUSTER)):
    for _step in STEPS:
        app.task(name=step_task(_queue, _step), bind=True)(_run)
