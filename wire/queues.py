"""Queue and task names: where each side of a saga listens.

* The control plane's workers consume :data:`CONTROL_QUEUE`; executors send their answers
  there as task :data:`REPLY_TASK`.
* A node agent consumes ``agent.<cluster>.<node>`` (:func:`agent_queue`), a cluster's
  connector ``connector.<cluster>`` (:func:`connector_queue`); each registers one task per
  step it runs, ``shaper.agent.<step>`` or ``shaper.connector.<step>`` (:func:`step_task`).
* The queue also names who may answer for it: its consumer's API token scope
  (:func:`executor_scope`), so only the node or cluster a step was sent to can report it.
"""

from __future__ import annotations

CONTROL_QUEUE = "control"
# The control plane's task that takes an executor's StepReport (app/actions/tasks.py).
REPLY_TASK = "app.actions.tasks.report"

AGENT = "agent"
CONNECTOR = "connector"


def agent_queue(cluster: str, node: str) -> str:
    """The queue of the node agent on ``node`` of ``cluster``."""
    return f"{AGENT}.{cluster}.{node}"


def agent_queue_prefix(cluster: str) -> str:
    """What the queues of every node agent of ``cluster`` start with."""
    return f"{AGENT}.{cluster}."


def connector_queue(cluster: str) -> str:
    """The queue of the connector of ``cluster``."""
    return f"{CONNECTOR}.{cluster}"


def connector_cluster(queue: str) -> str:
    """The cluster whose connector consumes ``queue``: connector.lab → lab."""
    if not is_connector_queue(queue):
        raise ValueError(f"{queue!r} is not a connector's queue")
    return queue.removeprefix(f"{CONNECTOR}.")


def is_agent_queue(queue: str) -> bool:
    return queue.startswith(f"{AGENT}.")


def is_connector_queue(queue: str) -> bool:
    return queue.startswith(f"{CONNECTOR}.")


def step_task(queue: str, step: str) -> str:
    """The task name an executor registers for a step: shaper.agent.restore, …"""
    kind = AGENT if is_agent_queue(queue) else CONNECTOR
    return f"shaper.{kind}.{step}"


def executor_scope(queue: str) -> str:
    """The token scope of whoever consumes a queue: agent.lab.n1 → agent:lab/n1."""
    kind, _, rest = queue.partition(".")
    if kind == AGENT:
        cluster, _, node = rest.partition(".")
        return f"agent:{cluster}/{node}"
    return f"connector:{rest}"
