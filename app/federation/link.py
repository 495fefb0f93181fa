"""The inter-cluster link as measured: what the checkpoint images of a group's moves took to
cross it.

A running job's move copies its image from its node in one cluster to its target node in
another (the ``transfer`` step of ``app.actions.recipes``' move recipe); the agent reports
the bytes and the seconds. The group's planning prices a start or a move away from home
with the measured rate once there is one (the last ``SAMPLES`` transfers, bytes over
seconds: a large image weighs more than a small one), and with the group's configured
``inter_cluster_bandwidth_mib_per_s`` until then.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.actions.models import Action, ActionKind, ActionStep, StepState
from wire.steps import AgentStep, StepPhase

SAMPLES = 20
MIB = 1024 * 1024
# A copy reported faster than this took no measurable time: it tells nothing of the link.
MIN_SECONDS = 0.001


@dataclass(frozen=True)
class MeasuredLink:
    bandwidth_mib_per_s: float
    samples: int


def measured_link(session: Session, cluster_ids: list[int]) -> MeasuredLink | None:
    """The rate of the last transfers of moves between two of ``cluster_ids``; None when
    there was none."""
    rows = session.exec(
        select(ActionStep.result)
        .join(Action, col(Action.id) == ActionStep.action_id)
        .where(
            Action.kind == ActionKind.move,
            col(Action.cluster_id).in_(cluster_ids),
            col(Action.target_cluster_id).in_(cluster_ids),
            ActionStep.name == AgentStep.transfer,
            ActionStep.phase == StepPhase.forward,
            ActionStep.state == StepState.succeeded,
        )
        .order_by(col(ActionStep.finished_at).desc(), col(ActionStep.id).desc())
        .limit(SAMPLES)
    ).all()
    sizes = [
        (float(result["bytes"]), float(result["seconds"]))
        for result in rows
        if isinstance(result.get("bytes"), int | float)
        and isinstance(result.get("seconds"), int | float)
        and result["seconds"] >= MIN_SECONDS
    ]
    if not sizes:
        return None
    total_bytes = sum(b for b, _ in sizes)
    total_seconds = sum(s for _, s in sizes)
    return MeasuredLink(bandwidth_mib_per_s=total_bytes / MIB / total_seconds, samples=len(sizes))
