"""A `sim` connector for the tests: a Celery worker on connector.<cluster> that records the
scheduler-level steps it is sent (once per idempotency key) and answers the control plane.

    SHAPER_SIM_CONNECTOR_LOG=steps.jsonl celery -A tests.actions.sim_connector worker \
        -Q connector.lab --pool solo
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from celery import Celery

STEPS = ("start", "resume", "requeue", "resize")
app = Celery("shaper-sim-connector", broker=os.environ.get("SHAPER_BROKER_URL", "memory://"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


def _record(step: dict[str, Any]) -> str:
    """Append the step to the log unless its key is there; 'executed' or 'duplicate'."""
    path = Path(os.environ["SHAPER_SIM_CONNECTOR_LOG"])
    with open(path, "a+") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.seek(0)
        if any(json.loads(line)["key"] == step["key"] for line in log if line.strip()):
            return "duplicate"
        log.write(json.dumps(step) + "\n")
        return "executed"


def _register(name: str) -> None:
    @app.task(name=f"shaper.connector.{name}")
    def run(step: dict[str, Any]) -> None:
        outcome = _record(step)
        app.send_task(
            step["reply_task"],
            kwargs={
                "report": {
                    "action_id": step["action_id"],
                    "key": step["key"],
                    "ok": True,
                    "outcome": outcome,
                    "result": {"summary": f"sim scheduler did {name} of {step['workload_id']}"},
                },
                "token": os.environ["SHAPER_CONNECTOR_TOKEN"],
            },
            queue=step["reply_queue"],
        )


for _name in STEPS:
    _register(_name)
