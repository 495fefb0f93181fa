from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from app.api.deps import ClockDep, SessionDep, scoped
from app.core.gc_pause import paused_gc
from app.telemetry import service
from wire.telemetry import NodeSamples, TelemetryAck, TelemetryPush

router = APIRouter(tags=["telemetry"])


class _PushRequest(Request):
    """A request whose JSON body is parsed straight into the wire schema.

    FastAPI would ``json.loads`` a 5 MiB snapshot into dicts and then validate those
    (twice the work, on the event loop, with the garbage collector scanning every new
    object). Here pydantic-core parses and validates the bytes in one pass, in a worker
    thread with the collector paused; FastAPI then checks the ready model against the
    declared body type, which accepts the instance as it is. A body that fails is handed
    to FastAPI as plain ``json.loads`` output instead, so malformed JSON (400) and schema
    errors (422 naming the field) come out exactly as for any other route.
    """

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = await run_in_threadpool(service.parse_push, body)
            except ValidationError:
                self._json = json.loads(body)
        return self._json


class _PushRoute(APIRoute):
    """Reads the body with ``_PushRequest``, and keeps the garbage collector paused from the
    parse to the response: re-enabled in between, it would first scan the tens of
    thousands of objects the parse just made (about 25 ms for 20,000 jobs), all still
    alive. The pause is process-wide and ends with the request; nothing here makes
    reference cycles that need collecting meanwhile."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def push_handler(request: Request) -> Response:
            with paused_gc():
                return await handler(_PushRequest(request.scope, request.receive))

        return push_handler


def push_telemetry(
    session: SessionDep, clock: ClockDep, cluster: str, push: TelemetryPush
) -> TelemetryAck:
    """A full snapshot or a delta (the contract: wire/telemetry.py). An exact replay is
    acknowledged with ``duplicate: true`` and not written twice; 409 ``snapshot_required``
    (a gap), ``stale_session`` (another connector owns the cluster), ``replay_mismatch``
    or ``out_of_order``; 422 for a push that cannot be a cluster's state."""
    return service.ingest(session=session, cluster_name=cluster, push=push, now=clock.now())


router.add_api_route(
    "/clusters/{cluster}/telemetry",
    push_telemetry,
    methods=["POST"],
    responses={
        409: {
            "description": "snapshot_required (sequence gap or unknown session: send a "
            "snapshot), stale_session (superseded by a newer connector: stop), "
            "replay_mismatch or out_of_order (send a snapshot with a higher seq)"
        }
    },
    route_class_override=_PushRoute,
    **scoped("connector:{cluster}"),
)


class SamplesAck(BaseModel):
    accepted: int


@router.post("/clusters/{cluster}/nodes/{node}/samples", **scoped("agent:{cluster}/{node}"))
def push_node_samples(
    session: SessionDep, clock: ClockDep, cluster: str, node: str, body: NodeSamples
) -> SamplesAck:
    """A node agent's measurements of its own node (CPU, memory; GPUs through NVML)."""
    accepted = service.record_node_samples(
        session=session,
        cluster_name=cluster,
        node_name=node,
        samples=list(body.samples),
        now=clock.now(),
    )
    return SamplesAck(accepted=accepted)
