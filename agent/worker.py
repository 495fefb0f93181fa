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

from celery import Celery

from agent.protocol import AgentStep, StepRequest
from agent.steps import StepExecutor
from connectors.base import make_executor_app, run_executor_worker


def agent_queue(cluster: str, node: str) -> str:
    return f"agent.{cluster}.{node}"


def make_agent_app(
    *, broker: str, cluster: str, node: str, executor: StepExecutor, token: str
) -> Celery:
    """token: this node's API token (scope agent:<cluster>/<node>); the control plane
    accepts a step's answer only from the node the step was sent to."""
    return make_executor_app(
        name=f"shaper-agent-{cluster}-{node}",
        broker=broker,
        queue=agent_queue(cluster, node),
        task_names=[f"shaper.agent.{step.value}" for step in AgentStep],
        handle=lambda step: executor.run(StepRequest.model_validate(step)),
        token=token,
    )


def run_worker(app: Celery, *, cluster: str, node: str, loglevel: str = "INFO") -> None:
    run_executor_worker(app, queue=agent_queue(cluster, node), loglevel=loglevel)
