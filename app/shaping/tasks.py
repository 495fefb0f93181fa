"""Celery entry point of the shaping cycle: one run per period, for every cluster, then for
every federation group."""

from __future__ import annotations

import logging

from sqlmodel import Session, select

from app.actions import tasks as action_tasks
from app.clusters.models import Cluster
from app.core.clock import SystemClock
from app.core.db import begin, get_engine
from app.core.task import task
from app.federation import service as federation_service
from app.federation.moves import propose_moves
from app.shaping.cycle import run_cycle
from app.shaping.dispatch import approved_actions
from app.shaping.lease import shaping_lease

log = logging.getLogger(__name__)


@task(name="app.shaping.tasks.run_shaping_cycles", time_limit=120, soft_time_limit=100)
def run_shaping_cycles() -> dict[str, int]:
    """Plan every cluster once; a replica that is not the leader does nothing.

    Not ``acks_late``: a cycle lost with its worker is simply run again one period later.
    Each cluster's cycle opens and ends its own short transactions (``app.shaping.cycle``):
    no transaction spans a solve, so the API keeps reading and writing meanwhile.
    """
    planned: dict[str, int] = {}
    with Session(get_engine()) as lease_session, shaping_lease(lease_session) as leader:
        if not leader:
            log.info("another replica holds the shaping lease; skipping this period")
            return planned
        with Session(get_engine()) as session:
            begin(session, writes=False)
            names = list(session.exec(select(Cluster.name).order_by(Cluster.name)))
        for name in names:
            with Session(get_engine(), expire_on_commit=False) as session:
                try:
                    result = run_cycle(session=session, cluster_name=name, now=SystemClock().now())
                except Exception:  # one cluster's failure must not starve the others
                    log.exception("shaping cycle failed for cluster %s", name)
                    continue
                planned[name] = result.plan_id
                log.info(
                    "cluster %s: %s plan %s (%s), %d actions%s%s",
                    name,
                    "kept" if result.kept else "new",
                    result.plan_id,
                    result.status,
                    result.actions,
                    f", {result.violations} violations" if result.violations else "",
                    f", {result.expired} expired" if result.expired else "",
                    extra={"cluster": name, "plan_id": result.plan_id},
                )
                begin(session, writes=False)
                ready = approved_actions(session=session, plan_id=result.plan_id)
            for action_id in ready:  # enforce mode: the sagas start now, not at the next sweep
                action_tasks.kick(action_id)
        _federate()
    return planned


def _federate() -> None:
    """Each federation group's plan, after its members' own: its moves of pending jobs to
    another cluster of the group (app.federation.moves)."""
    with Session(get_engine()) as session:
        begin(session, writes=False)
        groups = [
            g.name
            for g in federation_service.list_groups(session=session)
            if len(federation_service.members(session=session, group=g)) >= 2
        ]
    for group in groups:
        with Session(get_engine(), expire_on_commit=False) as session:
            try:
                outcome = propose_moves(session=session, group=group, now=SystemClock().now())
            except Exception:  # one group's failure must not starve the others
                log.exception("federation planning failed for group %s", group)
                continue
        log.info(
            "federation group %s: %d moves proposed, %d approved, %d kept, %d superseded",
            group,
            len(outcome.proposed),
            len(outcome.approved),
            outcome.kept,
            outcome.superseded,
            extra={"federation_group": group},
        )
        for action_id in outcome.approved:
            action_tasks.kick(action_id)
