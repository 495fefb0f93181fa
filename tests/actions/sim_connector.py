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

from wire.executor import make_executor_app
from wire.queues import connector_queue
from wire.steps import Outcome, StepReport

# A scheduler that does whatever it is asked: every scheduler-level step, confirms included.
STEPS = ("start", "resume", "requeue", "resize", "confirm", "reserve", "unreserve")


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


def _handle(step: dict[str, Any]) -> StepReport:
    return StepReport(
        action_id=step["action_id"],
        key=step["key"],
        ok=True,
        outcome=Outcome(_record(step)),
        result={"summary": f"sim scheduler did {step['step']} of {step['workload_id']}"},
    )


# The same worker runtime as the real connectors and agents (wire.executor).
app = make_executor_app(
    broker=os.environ.get("SHAPER_BROKER_URL", "memory://"),
    queue=connector_queue("lab"),
    steps=STEPS,
    handle=_handle,
    token=os.environ.get("SHAPER_CONNECTOR_TOKEN", ""),
)
