from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ClockDep, SessionDep, scoped
from app.telemetry import service
from connectors.base import TelemetryAck, TelemetryPush

router = APIRouter(tags=["telemetry"])


@router.post(
    "/clusters/{cluster}/telemetry",
    responses={409: {"description": "Sequence gap or new connector session: send a snapshot"}},
    **scoped("connector:{cluster}"),
)
def push_telemetry(
    session: SessionDep, clock: ClockDep, cluster: str, push: TelemetryPush
) -> TelemetryAck:
    """A full snapshot or a delta. A replayed sequence number is acknowledged with
    ``duplicate: true`` and not written twice; a gap answers 409 ``snapshot_required``."""
    return service.ingest(session=session, cluster_name=cluster, push=push, now=clock.now())
