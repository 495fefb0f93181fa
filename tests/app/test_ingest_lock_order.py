"""A connector's ingest and a transaction that holds one of the cluster's job rows and adds
a row pointing at the cluster, at the same moment, on a real PostgreSQL.

The ingest locks the cluster's row, then updates the jobs its push changes. A saga step
that ends a start on Slurm holds the job's row and adds an ``unreserve`` action (the plan
gives the job's reservation back); an operator's drain holds the node's row and adds a
drain action. Adding a row that points at the cluster checks its foreign key with a
key-share lock on the cluster's row: with the ingest's FOR UPDATE of that row it waited
for the ingest, which waited for the job: PostgreSQL aborted one with a deadlock. The
ingest now locks the row FOR NO KEY UPDATE, which the check passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions import moved
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.jobs.models import Job
from app.telemetry import ingest as ingest_module
from app.telemetry import service as telemetry_service
from tests.app.builders import job, node, registered_with, running, snapshot
from tests.support.at_once import at_once, pause
from tests.support.clock import T0
from wire.telemetry import JobState, TelemetrySnapshot


def test_an_ingest_and_a_saga_adding_an_action_for_a_job_it_holds_do_not_deadlock(
    committed_postgres_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session(committed_postgres_engine) as session:
        registered_with(session, "lab", snapshot(1, nodes=[node("n1")], jobs=[job("j1")]), now=T0)
        held = session.exec(select(Job).where(Job.external_id == "j1")).one()
        job_id, cluster_id = held.id, held.cluster_id
    # Each side pauses once it holds its first row: the ingest the cluster's, the saga the
    # job's. Then the ingest updates the job (the push says it runs) and the saga adds its
    # action.
    both_hold = threading.Barrier(2)
    _pause_ingest_once_locked(monkeypatch, lambda: both_hold.wait(timeout=10))
    push = _push_running("j1")

    def saga_step(session: Session) -> None:
        session.exec(select(Job).where(Job.id == job_id).with_for_update()).one()
        both_hold.wait(timeout=10)
        session.add(
            Action(
                cluster_id=cluster_id,
                job_id=job_id,
                kind=ActionKind.unreserve,
                state=ActionState.approved,
                idempotency_key="give-back",
                created_at=T0,
                updated_at=T0,
            )
        )
        session.commit()

    outcomes = at_once(committed_postgres_engine, {"ingest": push, "saga": saga_step})
    assert outcomes == {"ingest": "done", "saga": "done"}, outcomes
    with Session(committed_postgres_engine) as session:
        ran = session.exec(select(Job).where(Job.id == job_id)).one()
        assert ran.state == JobState.running
        assert session.exec(select(Action).where(Action.idempotency_key == "give-back")).one()


def test_a_moved_jobs_arrival_and_the_targets_ingest_take_turns(
    committed_postgres_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished move writes the job's row at its target (``moved.fence_arrival``) as the
    target's connector reports the job for the first time. Both inserted the same row: the
    push failed on the duplicate key, or the two deadlocked. The arrival now locks the
    target's row first, as the ingest does, so the ingest writes the row and the arrival
    raises its generation, whichever comes first."""
    with Session(committed_postgres_engine) as session:
        registered_with(session, "home", snapshot(1, nodes=[node("h1")], jobs=[job("j1")]), now=T0)
        registered_with(session, "lab", snapshot(1, nodes=[node("n1")]), now=T0)
        home_job = session.exec(select(Job).where(Job.external_id == "j1")).one()
        target = session.exec(select(Cluster).where(Cluster.name == "lab")).one()
        move = Action(
            cluster_id=home_job.cluster_id,
            job_id=home_job.id,
            kind=ActionKind.migrate,
            state=ActionState.running,
            idempotency_key="move",
            target_cluster_id=target.id,
            fencing_token=7,
            created_at=T0,
            updated_at=T0,
        )
        session.add(move)
        session.commit()
        home_id, target_id, move_id = home_job.id, target.id, move.id
    # The ingest pauses once it holds the target's row; the arrival, once it has written
    # its row (or, waiting for the target's row, not at all: the pause gives up then).
    paused = threading.Barrier(2)
    _pause_ingest_once_locked(monkeypatch, lambda: pause(paused))
    push = _push_running("j1-moved")

    def arrival(session: Session) -> None:
        home = session.exec(select(Job).where(Job.id == home_id).with_for_update()).one()
        moved.fence_arrival(
            session,
            home,
            session.get_one(Cluster, target_id),
            "j1-moved",
            session.get_one(Action, move_id),
            T0 + timedelta(minutes=1),
        )
        session.flush()
        pause(paused)
        time.sleep(0.5)  # the ingest, going on, reads the target's jobs before this commits
        session.commit()

    outcomes = at_once(committed_postgres_engine, {"ingest": push, "arrival": arrival})
    assert outcomes == {"ingest": "done", "arrival": "done"}, outcomes
    with Session(committed_postgres_engine) as session:
        arrived = session.exec(
            select(Job).where(Job.cluster_id == target_id, Job.external_id == "j1-moved")
        ).one()
        assert arrived.state == JobState.running
        assert arrived.generation == 7


def _pause_ingest_once_locked(monkeypatch: pytest.MonkeyPatch, wait: Callable[[], object]) -> None:
    """The ingest calls ``wait`` once it holds its cluster's row."""
    lock_cluster = ingest_module._lock_cluster

    def locked_then_paused(session: Session, name: str) -> Any:
        cluster = lock_cluster(session, name)
        wait()
        return cluster

    monkeypatch.setattr(ingest_module, "_lock_cluster", locked_then_paused)


def _push_running(external_id: str) -> Callable[[Session], None]:
    """Cluster ``lab``'s next push: ``external_id`` runs on two GPUs of n1."""

    def push(session: Session) -> None:
        telemetry_service.ingest(
            session=session,
            cluster_name="lab",
            push=TelemetrySnapshot.model_validate(
                snapshot(2, nodes=[node("n1")], jobs=[running(external_id, "n1", [0, 1])])
            ),
            now=T0 + timedelta(minutes=1),
        )

    return push
