"""An operator's move of a queued Armada job set to another executor cluster, as an action
(``JOB_SET_ACTION_KINDS``).

``POST /api/v1/clusters/{cluster}/job-sets/{queue}/{job_set}/move`` with ``{"executor": …}``
makes an action about the job set, not one job — no job; ``job_set_queue``, ``job_set``
and ``target_executor`` name it and where it goes — approved by the operator who asked,
which the caller dispatches: its saga (``app.actions.recipes.job_set_steps``) is one
``move_job_set`` step on the cluster's connector, which cancels each queued job of the set
and submits it again selecting that executor (``connectors.armada``), or refuses, saying
why (a job has started since, a job no node of that executor can run); the refusal is the
action's error.

Decided here, on the control plane's view (the connector has the last word):

* the cluster exists (404) and runs Armada (409);
* the executor is one of the cluster's (its nodes' label ``armadaproject.io/executor``,
  as the Armada connector reports them), else 422 naming ``executor``;
* the job set is known and queued: its jobs, as telemetry shows them (a job names its queue
  and job set in its submit spec, a gang in its external id), are all pending, at least one
  of them (409 otherwise), and not all held on that executor's nodes already (409);
* no other move of the job set, and no saga on one of its jobs, is unfinished (409).

The cluster's row is locked while deciding, so two requests for one job set make one action.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.models import (
    ACTIVE_ACTION_STATES,
    JOB_SET_ACTION_KINDS,
    Action,
    ActionKind,
    ActionPublic,
    ActionState,
)
from app.audit.models import Actor
from app.clusters.models import Cluster
from app.core.errors import Conflict, Invalid
from app.core.lookup import found, row_id
from app.jobs.models import Job
from app.nodes.models import Node
from wire.telemetry import TERMINAL_JOB_STATES, JobState, SchedulerKind

# The node label that names a node's executor cluster in the Armada connector's telemetry
# (connectors.armada.reports.EXECUTOR_NODE_LABEL; app may not import connectors, and
# tests/app/test_job_set_moves.py checks the two agree through the real connector).
EXECUTOR_LABEL = "armadaproject.io/executor"
# A gang's external id (connectors.armada.gangs): ``gang:<queue>/<job set>/<gang id>``.
GANG_PREFIX = "gang:"


def in_job_set(job: Job, queue: str, job_set: str) -> bool:
    """Whether the control plane's view puts ``job`` in the job set: its Armada submit
    spec names them (connectors.armada.specs: ``native.queue``, ``native.job_set``), or it
    is a gang of it."""
    if job.external_id.startswith(f"{GANG_PREFIX}{queue}/{job_set}/"):
        return True
    if not job.submit_spec:
        return False
    try:
        spec = json.loads(job.submit_spec)
    except ValueError:
        return False
    native = spec.get("native") if isinstance(spec, dict) else None
    return (
        isinstance(native, dict)
        and spec.get("scheduler") == SchedulerKind.armada.value
        and native.get("queue") == queue
        and native.get("job_set") == job_set
    )


def jobs_of(session: Session, cluster_id: int, queue: str, job_set: str) -> list[Job]:
    """The job set's jobs that have not ended, in the control plane's view."""
    jobs = session.exec(
        select(Job).where(
            Job.cluster_id == cluster_id,
            col(Job.state).not_in([s.value for s in TERMINAL_JOB_STATES]),
        )
    ).all()
    return sorted(
        (job for job in jobs if in_job_set(job, queue, job_set)), key=lambda j: j.external_id
    )


def unfinished_move(
    session: Session, cluster_id: int, queue: str, job_set: str, *, but: int | None = None
) -> tuple[int, str] | None:
    """Another move of the job set that has not ended (proposed or active): id, state."""
    states = [ActionState.proposed.value, *(s.value for s in ACTIVE_ACTION_STATES)]
    row = session.exec(
        select(Action.id, Action.state).where(
            Action.cluster_id == cluster_id,
            col(Action.kind).in_([k.value for k in JOB_SET_ACTION_KINDS]),
            Action.job_set_queue == queue,
            Action.job_set == job_set,
            Action.id != (but or 0),
            col(Action.state).in_(states),
        )
    ).first()
    if row is None or row[0] is None:
        return None
    return row[0], str(row[1])


def request_job_set_move(
    *,
    session: Session,
    cluster: str,
    queue: str,
    job_set: str,
    executor: str,
    reason: str | None,
    now: datetime,
    actor: Actor | None,
) -> ActionPublic:
    """Make an approved ``move_job_set`` action (the module's docstring says when it is
    refused); the caller dispatches it once this has committed."""
    row = found(
        session.exec(select(Cluster).where(Cluster.name == cluster).with_for_update()).first(),
        f"cluster {cluster!r} does not exist",
        resource="cluster",
        resource_id=cluster,
    )
    where = f"job set {job_set} of queue {queue} in cluster {cluster}"
    if SchedulerKind(row.scheduler) is not SchedulerKind.armada:
        raise Conflict(
            f"cluster {cluster} runs {row.scheduler}: only Armada has job sets to move",
            resource="cluster",
            resource_id=cluster,
            details={"scheduler": str(row.scheduler)},
        )
    cluster_id = row_id(row)
    labels = session.exec(select(Node.name, Node.labels).where(Node.cluster_id == cluster_id))
    executors: dict[str, set[str]] = {}
    for name, node_labels in labels:
        if (node_labels or {}).get(EXECUTOR_LABEL):
            executors.setdefault(node_labels[EXECUTOR_LABEL], set()).add(name)
    if executor not in executors:
        raise Invalid(
            f"cluster {cluster} has no executor cluster {executor!r} (its nodes report "
            f"{', '.join(sorted(executors)) or 'none'})",
            field="executor",
            details={"executors": sorted(executors)},
        )
    other = unfinished_move(session, cluster_id, queue, job_set)
    if other is not None:
        raise Conflict(
            f"{where}: action {other[0]} moving it is {other[1]}; wait for it to end or cancel it",
            resource="job_set",
            resource_id=f"{queue}/{job_set}",
            details={"action_id": other[0], "state": other[1]},
        )
    jobs = jobs_of(session, cluster_id, queue, job_set)
    if not jobs:
        raise Conflict(
            f"{where}: no queued job of it is known (telemetry names a job's job set in its "
            "submit spec, a gang's in its id)",
            resource="job_set",
            resource_id=f"{queue}/{job_set}",
        )
    started = [f"{j.external_id} ({j.state})" for j in jobs if j.state != JobState.pending]
    if started:
        raise Conflict(
            f"{where} is not queued: only a queued job set moves, and {', '.join(started)} "
            "left the queue",
            resource="job_set",
            resource_id=f"{queue}/{job_set}",
            details={"jobs": [j.external_id for j in jobs if j.state != JobState.pending]},
        )
    there = executors[executor]
    if all(j.required_nodes and set(j.required_nodes) <= there for j in jobs):
        raise Conflict(
            f"{where}: its jobs run only on executor {executor}'s nodes already",
            resource="job_set",
            resource_id=f"{queue}/{job_set}",
        )
    busy = session.exec(
        select(Action.id, Job.external_id)
        .join(Job, col(Job.id) == col(Action.job_id))
        .where(
            col(Action.job_id).in_([row_id(j) for j in jobs]),
            col(Action.state).in_([s.value for s in ACTIVE_ACTION_STATES]),
        )
    ).first()
    if busy is not None:
        raise Conflict(
            f"{where}: action {busy[0]} on its job {busy[1]} has not ended; wait for it",
            resource="job_set",
            resource_id=f"{queue}/{job_set}",
            details={"action_id": busy[0]},
        )
    return action_service.create_operator_action(
        session=session,
        cluster_id=cluster_id,
        kind=ActionKind.move_job_set,
        subject={"job_set_queue": queue, "job_set": job_set, "target_executor": executor},
        reason=reason,
        what=f"move of {where} to executor {executor}",
        now=now,
        actor=actor,
        changes={"cluster": cluster, "queue": queue, "job_set": job_set, "executor": executor},
    )
