"""In-process executors for the embedded default: saga steps delivered by a function call.

With a broker, a saga's steps are Celery messages that node agents (``agent.<c>.<n>``) and
connectors (``connector.<c>``) consume in their own processes. On the embedded default
there is no broker, so nothing would consume them. A process that hosts executors itself —
``shaper demo`` with its simulated clusters — registers them here by queue prefix, and
``app.actions.tasks.send`` hands their steps over directly; the answer is applied as the
executor's report, with that executor's scope. A step for a queue nobody registered keeps
going to the broker (and, with none, times out into a failed step whose error says so).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# (queue, step message) -> report (the wire dict executors send back)
Executor = Callable[[str, dict[str, Any]], dict[str, Any]]

_lock = threading.Lock()
_executors: dict[str, Executor] = {}


def register(queue_prefix: str, executor: Executor) -> None:
    """Answer every step whose queue starts with ``queue_prefix`` (``connector.lab``,
    ``agent.lab.``) with ``executor``, in this process."""
    with _lock:
        _executors[queue_prefix] = executor


def unregister(queue_prefix: str) -> None:
    with _lock:
        _executors.pop(queue_prefix, None)


def find(queue: str) -> Executor | None:
    with _lock:
        for prefix, executor in _executors.items():
            if queue == prefix or (prefix.endswith(".") and queue.startswith(prefix)):
                return executor
    return None
