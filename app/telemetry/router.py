from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from app.api.deps import ClockDep, SessionDep, scoped
from app.telemetry import service
from connectors.base import NodeSamples, TelemetryAck, TelemetryPush

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


class SamplesAck(BaseModel):
    accepted: int


@router.post("/clusters/{cluster}/nodes/{node}/samples", **scoped("agent:{cluster}/{node}"))
def push_node_samples(
    session: SessionDep, cluster: str, node: str, body: NodeSamples
) -> SamplesAck:
    """A node agent's measurements of its own node (CPU, memory; GPUs through NVML)."""
    accepted = service.record_node_samples(
        session=session, cluster_name=cluster, node_name=node, samples=list(body.samples)
    )
    return SamplesAck(accepted=accepted)
