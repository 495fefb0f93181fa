"""``GET /metrics``: the scrape endpoint (viewer scope; Prometheus sends the token with
``authorization: {credentials_file: …}`` in its scrape config)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.api.deps import ClockDep, SessionDep, scoped
from app.metrics.collector import DatabaseCollector

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, **scoped("viewer"))
def metrics(request: Request, session: SessionDep, clock: ClockDep) -> Response:
    """Shaper's metrics in Prometheus' text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(session, clock.now()))
    registry.register(request.app.state.request_histogram)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
