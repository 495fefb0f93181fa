"""The executor runtime: a node agent or a connector serving its saga steps as a Celery worker.

Both kinds of executor serve their queue the same way: one task per step name
(:func:`wire.queues.step_task`), late acknowledgement (a step lost with its worker is
delivered again; the executor's journal makes a second run harmless), one step at a time in
a solo pool, and the answer sent to the step's reply queue with the executor's own token,
so the control plane accepts it only from the node or cluster the step was sent to. What a
step does is the executor's ``handle``; this module knows nothing of agents or schedulers.

Celery is imported only when a worker is built, so the rest of ``wire`` stays cheap to
import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from wire.queues import CONTROL_QUEUE, REPLY_TASK, step_task
from wire.redaction import MASK
from wire.steps import StepReport

log = logging.getLogger(__name__)

# Publishing the answer retries for about a minute (a broker restart); after that the
# control plane times the step out and sends it again, and the journal answers.
REPLY_RETRY = {"max_retries": 30, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 3}

# A step message as it comes off the queue → its report (None: nothing can be answered).
StepHandler = Callable[[dict[str, Any]], StepReport | None]


def make_executor_app(
    *,
    broker: str,
    queue: str,
    steps: Iterable[str],
    handle: StepHandler,
    token: str,
    redirect_stdouts: bool = True,
) -> Any:
    """A Celery app serving ``queue``: the task of each of ``steps`` runs ``handle(step)``
    and reports its answer with ``token`` (``agent:<cluster>/<node>`` for a node agent,
    ``connector:<cluster>`` for a connector)."""
    from celery import Celery

    app = Celery(f"shaper-{queue.replace('.', '-')}", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=redirect_stdouts,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        timezone="UTC",
    )

    def run_step(step: dict[str, Any]) -> None:
        report = handle(step)
        if report is None:
            return
        try:
            app.send_task(
                str(step.get("reply_task") or REPLY_TASK),
                kwargs={"report": report.model_dump(mode="json"), "token": token},
                # What Celery shows of the arguments (the message's ``kwargsrepr``: task
                # events, ``celery inspect``, Flower, its log records' ``data``) is by
                # default their repr, the token in full (nested values only a few levels
                # deep, so a result's may show too). Only which answer it is, instead.
                kwargsrepr=_shown(report),
                queue=str(step.get("reply_queue") or CONTROL_QUEUE),
                retry=True,
                retry_policy=REPLY_RETRY,
            )
        except Exception:  # the control plane resends the step; the journal answers it
            log.exception("could not report %s to the control plane", report.key)

    for step_name in steps:
        app.task(name=step_task(queue, step_name))(run_step)
    return app


def _shown(report: StepReport) -> str:
    """The arguments of a reply as Celery shows them: which step, how it went; never the
    token, nor the result."""
    said = {"action_id": report.action_id, "key": report.key, "ok": report.ok}
    return repr({"report": said, "token": MASK})


def run_executor_worker(app: Any, *, queue: str, loglevel: str = "INFO") -> None:
    """Serve ``queue`` in this thread, one step at a time, until SIGTERM/SIGINT (a warm
    shutdown)."""
    app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--pool",
            "solo",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-l",
            loglevel,
        ]
    )
