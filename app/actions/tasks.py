"""Celery entry points of the action sagas. Thin: ids in, own session, logic in ``saga``.

All three are safe to run twice (``acks_late``): ``advance`` and ``sweep`` recompute what to
do from the rows, and ``report`` ignores a report for a step that is no longer waiting.
Messages decided by a transaction are sent after it commits.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.actions import local, saga
from app.actions.messages import Outgoing
from app.core.clock import SystemClock
from app.core.config import get_settings
from app.core.db import get_engine
from app.core.errors import Unauthorized
from app.core.security import Principal
from app.core.task import task
from app.tokens import service as token_service
from app.worker import get_celery_app
from wire.queues import CONTROL_QUEUE, REPLY_TASK, executor_scope
from wire.steps import StepReport

log = logging.getLogger(__name__)
_RETRY = {
    "acks_late": True,
    "autoretry_for": (OperationalError, OSError),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 10,
    "time_limit": 120,
    "soft_time_limit": 100,
}


def _timings() -> dict[str, Any]:
    """The saga's timing settings (SHAPER_ACTION_STEP_TIMEOUT_S,
    SHAPER_SCHEDULER_START_WAIT_S) as keyword arguments of saga.advance."""
    settings = get_settings()
    return {
        "step_timeout_s": settings.action_step_timeout_s,
        "start_wait_s": settings.scheduler_start_wait_s,
    }


def send(outgoing: list[Outgoing]) -> None:
    # The Shaper app explicitly: in an API process Celery's "current" app may be a default
    # one that points at a broker nobody configured.
    celery_app = get_celery_app()  # built on first use, not when this module is imported
    eager = celery_app.conf.task_always_eager
    for message in outgoing:
        if eager and message.task == saga.ADVANCE_TASK:
            _later(message.countdown, advance, message.kwargs["action_id"])
            continue
        executor = local.find(message.queue) if eager else None
        if executor is not None:
            _later(message.countdown, _deliver_locally, executor, message)
            continue
        celery_app.send_task(
            message.task,
            kwargs=message.kwargs,
            queue=message.queue,
            countdown=message.countdown or None,
            retry=True,
            retry_policy={"max_retries": 10, "interval_start": 0.5, "interval_step": 1.0},
        )


def _later(countdown: float, function: Any, *args: Any) -> None:
    """In-process: run now, or after ``countdown`` seconds on a timer thread (a poll's
    pause must not block the caller, nor be skipped)."""
    if countdown <= 0:
        function(*args)
        return
    timer = threading.Timer(countdown, _logged, args=(function, *args))
    timer.daemon = True
    timer.start()


def _logged(function: Any, *args: Any) -> None:
    try:
        function(*args)
    except Exception:  # a timer thread has nobody to raise to
        log.exception("in-process delivery of %s failed", getattr(function, "__name__", function))


def _deliver_locally(executor: local.Executor, message: Outgoing) -> None:
    """Embedded default: the step runs in this process (app.actions.local) and its answer
    is recorded as that executor's report; the saga then goes on from there."""
    answer = executor(message.queue, message.kwargs["step"])
    reporter = Principal(
        token_id=0,
        name=f"in-process {message.queue}",
        scopes=frozenset({executor_scope(message.queue)}),
    )
    with Session(get_engine(), expire_on_commit=False) as session:
        outgoing = saga.record_report(
            session=session,
            report=StepReport.model_validate(answer),
            now=SystemClock().now(),
            reporter=reporter,
            start_wait_s=get_settings().scheduler_start_wait_s,
        )
    send(outgoing)


@task(name="app.actions.tasks.advance", **_RETRY)
def advance(action_id: int) -> None:
    """Move one action's saga as far as it can go (dispatches an approved action)."""
    with Session(get_engine(), expire_on_commit=False) as session:
        outgoing = saga.advance(
            session=session,
            action_id=action_id,
            now=SystemClock().now(),
            **_timings(),
        )
    send(outgoing)


@task(name=REPLY_TASK, **_RETRY)
def report(report: dict[str, Any], token: str | None = None) -> None:
    """An executor's answer for one step (sent by node agents and connectors), with the
    executor's API token (``agent:<cluster>/<node>``, ``connector:<cluster>``)."""
    now = SystemClock().now()
    with Session(get_engine(), expire_on_commit=False) as session:
        try:
            reporter = token_service.authenticate(session=session, plaintext=token or "", now=now)
        except Unauthorized as error:
            log.warning("report for step %s dropped: %s", report.get("key"), error.message)
            return
        outgoing = saga.record_report(
            session=session,
            report=StepReport.model_validate(report),
            now=now,
            reporter=reporter,
            start_wait_s=get_settings().scheduler_start_wait_s,
        )
    send(outgoing)


@task(name="app.actions.tasks.sweep", acks_late=False, time_limit=120)
def sweep() -> int:
    """Periodic: dispatch approved actions, resend or time out unanswered steps.

    Not ``acks_late``: a sweep lost with its worker is run again one period later.
    """
    with Session(get_engine(), expire_on_commit=False) as session:
        ids = saga.active_action_ids(session=session)
    for action_id in ids:
        try:
            with Session(get_engine(), expire_on_commit=False) as session:
                outgoing = saga.advance(
                    session=session,
                    action_id=action_id,
                    now=SystemClock().now(),
                    **_timings(),
                )
        except Exception:  # one broken saga must not stop the others
            log.exception("sweep could not advance action %s", action_id)
            continue
        send(outgoing)
    return len(ids)


def kick(action_id: int) -> None:
    """Dispatch an approved action now. With no broker (the embedded default) the
    in-process beat's sweep dispatches it within one period."""
    celery_app = get_celery_app()
    if not celery_app.conf.task_always_eager:
        celery_app.send_task(advance.name, args=[action_id], queue=CONTROL_QUEUE)
