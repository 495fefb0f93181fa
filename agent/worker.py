"""`shaper agent worker`: the node agent as a Celery worker on queue agent.<cluster>.<node>.

One task per saga step (``shaper.agent.checkpoint`` … ``shaper.agent.release``), each
taking one StepRequest and answering with a StepReport sent to the control plane's queue
(task ``app.actions.tasks.report``) with the node's ``agent:<cluster>/<node>`` token, so
only this node can answer its steps. Messages are acknowledged only after the step ran
(``acks_late``) and given back if the worker dies mid-step, so a step is never lost; the
fence journal (agent.fencing) makes running one twice harmless.

A solo pool: one step at a time per node, in arrival order, in the process that owns the
workloads it starts (the signal backend's restored workloads are its children).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task

from agent.protocol import AgentStep, StepRequest
from agent.steps import StepExecutor

log = logging.getLogger(__name__)
# Publishing the answer retries for about a minute (a broker restart); after that the
# control plane times the step out and sends it again, and the journal answers.
_REPLY_RETRY = {"max_retries": 30, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 3}


def agent_queue(cluster: str, node: str) -> str:
    return f"agent.{cluster}.{node}"


def make_agent_app(
    *, broker: str, cluster: str, node: str, executor: StepExecutor, token: str
) -> Celery:
    """token: this node's API token (scope agent:<cluster>/<node>); the control plane
    accepts a step's answer only from the node the step was sent to."""
    queue = agent_queue(cluster, node)
    app = Celery(f"shaper-agent-{cluster}-{node}", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        timezone="UTC",
    )

    def register(step: AgentStep) -> None:
        @app.task(name=f"shaper.agent.{step.value}", bind=True)
        def run_step(self: Task, step: dict[str, Any]) -> None:
            request = StepRequest.model_validate(step)
            report = executor.run(request)
            try:
                app.send_task(
                    request.reply_task,
                    kwargs={"report": report.model_dump(mode="json"), "token": token},
                    queue=request.reply_queue,
                    retry=True,
                    retry_policy=_REPLY_RETRY,
                )
            except Exception:  # the control plane resends the step; the journal answers it
                log.exception("could not report %s to the control plane", request.key)

    for step in AgentStep:
        register(step)
    return app


def run_worker(app: Celery, *, cluster: str, node: str, loglevel: str = "INFO") -> None:
    queue = agent_queue(cluster, node)
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
