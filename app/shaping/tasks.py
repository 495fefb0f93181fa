"""Celery entry point of the shaping cycle: one run per period, for every cluster, then for
every federation group.

With ``Settings.federation_solve_once`` a federation group of two or more clusters is
solved once instead (:func:`_plan_group`): each member's review runs first
(``cycle.prepare_cycle``), then the group is solved as one (``planning.solve_group``), each
member's plan is its slice of that solve (``planning.member_plan``, persisted by
``cycle.finish_cycle``) and the group's cross-cluster moves come from the same solve
(``moves.propose_moves``, made first: a move the solve no longer makes is withdrawn before
a member's plan acts on its job). A member whose review fails is left out of the solve;
when fewer than two members are left, each is planned alone. What changes while the group
is solved is checked when each plan is persisted (``app.federation.meanwhile``): a member
that left the group meanwhile is planned alone afresh (``cycle.Withdrawn``), and a move
approved meanwhile holds what of the plans conflicts with it. When the group cannot be
solved once (a member plans with a policy other than the group's, or the members' rules
disagree), or its plan is invalid, its members are planned apart and then its moves, as
with the setting off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial

from sqlmodel import Session, select

from app.actions import tasks as action_tasks
from app.clusters.models import Cluster
from app.core.clock import SystemClock
from app.core.config import get_settings
from app.core.db import begin, get_engine
from app.core.errors import Invalid
from app.core.task import task
from app.federation import service as federation_service
from app.federation.moves import MovesProposed, propose_moves
from app.federation.planning import GroupSolve, member_plan, solve_group
from app.shaping.cycle import (
    CycleResult,
    Prepared,
    Withdrawn,
    finish_cycle,
    prepare_cycle,
    run_cycle,
)
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
            groups = _groups(session)
        solve_once = get_settings().federation_solve_once
        grouped = {c for members in groups.values() for c in members} if solve_once else set()
        for name in names:
            if name not in grouped:
                _plan(planned, name, partial(_alone, name=name))
        if solve_once:
            for group, members in groups.items():
                _plan_group(planned, group, members, SystemClock().now())
        else:
            _federate(list(groups))
    return planned


def _groups(session: Session) -> dict[str, list[str]]:
    """Each federation group of two or more clusters → its members' names."""
    groups = {
        g.name: [c.name for c in federation_service.members(session=session, group=g)]
        for g in federation_service.list_groups(session=session)
    }
    return {name: members for name, members in groups.items() if len(members) >= 2}


def _alone(session: Session, *, name: str) -> CycleResult:
    return run_cycle(session=session, cluster_name=name, now=SystemClock().now())


def _plan(planned: dict[str, int], name: str, cycle: Callable[[Session], CycleResult]) -> None:
    """Run one cluster's cycle (the rest of it) in a session of its own, log its plan and
    kick the actions it approved; its failure is logged and starves no other cluster."""
    with Session(get_engine(), expire_on_commit=False) as session:
        try:
            result = cycle(session)
        except Exception:  # one cluster's failure must not starve the others
            log.exception("shaping cycle failed for cluster %s", name)
            return
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


def _plan_group(planned: dict[str, int], group: str, members: list[str], now: datetime) -> None:
    """A federation group's members planned by one solve of the group (module docstring)."""
    prepared: dict[str, Prepared] = {}
    for name in members:
        with Session(get_engine(), expire_on_commit=False) as session:
            try:
                prepared[name] = prepare_cycle(session=session, cluster_name=name, now=now)
            except Exception:  # one member's failure must not starve the others
                log.exception("shaping cycle failed for cluster %s", name)
    solved: GroupSolve | None = None
    if len(prepared) >= 2:
        with Session(get_engine(), expire_on_commit=False) as session:
            try:
                solved = solve_group(
                    session=session,
                    name=group,
                    now=now,
                    compare=False,
                    for_members=True,
                    only=list(prepared),
                )
            except Invalid as why:  # its members' settings: planned apart until changed
                log.warning(
                    "%s; its members are planned apart, then its moves",
                    why,
                    extra={"federation_group": group},
                )
            except Exception:
                log.exception(
                    "federation group %s could not be solved once; its members are planned "
                    "apart, then its moves",
                    group,
                    extra={"federation_group": group},
                )
    if solved is not None and solved.violations:
        # One member's bad data must not stall the others: planned apart this period, as
        # when the group cannot be solved once.
        log.error(
            "federation group %s: its plan is invalid (%s); its members are planned apart, "
            "then its moves",
            group,
            "; ".join(solved.violations[:5]),
            extra={"federation_group": group},
        )
        solved = None
    elif solved is not None:
        # The moves first: a proposed move the solve no longer makes is withdrawn before
        # a member's plan acts on its job instead.
        _moved(group, partial(propose_moves, group=group, now=now, solved=solved))
    for name, ready in prepared.items():

        def cycle(session: Session, ready: Prepared = ready, name: str = name) -> CycleResult:
            # Its slice is made here: a failure making it is this member's alone.
            mine = member_plan(solved, name) if solved is not None else None
            try:
                return finish_cycle(session=session, prepared=ready, solved=mine)
            except Withdrawn as why:  # it left the group meanwhile: its own plan, afresh
                log.warning("%s; planned alone", why, extra={"federation_group": group})
                return run_cycle(session=session, cluster_name=name, now=now)

        _plan(planned, name, cycle)
    if solved is None and len(prepared) >= 2:  # planned apart: the group's moves as before
        _federate([group])


def _federate(groups: list[str]) -> None:
    """Each federation group's plan, after its members' own: its moves of pending jobs to
    another cluster of the group (app.federation.moves)."""
    for group in groups:
        _moved(group, partial(propose_moves, group=group, now=SystemClock().now()))


def _moved(group: str, propose: Callable[..., MovesProposed]) -> None:
    """``propose(session=...)`` a group's moves in a session of its own, log them and kick
    those approved; a failure is logged and starves no other group."""
    with Session(get_engine(), expire_on_commit=False) as session:
        try:
            outcome = propose(session=session)
        except Exception:  # one group's failure must not starve the others
            log.exception("federation planning failed for group %s", group)
            return
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
