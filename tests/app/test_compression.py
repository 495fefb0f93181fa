"""Response compression (``app.main``: gzip at GZIP_LEVEL from GZIP_MIN_BYTES on): a large
read asked with ``Accept-Encoding: gzip`` comes gzipped and decodes to the same JSON; a
small one, a read not asking for it and a server-sent event stream come plain; the
health checks, the scrape endpoint, request timing and the security headers still work."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

from fastapi.testclient import TestClient
from sqlmodel import Session
from starlette.responses import StreamingResponse

from app.core.clock import FrozenClock
from app.core.config import Settings
from app.main import GZIP_MIN_BYTES, create_app
from tests.app.builders import node, registered_with, running, snapshot

MAP = "/api/v1/nodes/map?cluster=alpha"


def _fleet(session: Session, clock: FrozenClock) -> None:
    """alpha: 24 nodes, a job on each: a map of some KiB."""
    nodes = [node(f"n{i:02d}") for i in range(24)]
    jobs = [running(f"j{i:02d}", f"n{i:02d}", [0, 1, 2, 3]) for i in range(24)]
    registered_with(session, "alpha", snapshot(1, nodes=nodes, jobs=jobs), now=clock.now())


def _raw(client: TestClient, path: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    """The answer's headers and its body as sent, not decoded. Without an Accept-Encoding
    in ``headers`` the request has none (the client's own default is taken out)."""
    request = client.build_request("GET", path, headers=headers)
    if not any(name.lower() == "accept-encoding" for name in headers):
        del request.headers["accept-encoding"]
    response = client.send(request, stream=True)
    try:
        assert response.status_code == 200, response.read()
        return dict(response.headers), b"".join(response.iter_raw())
    finally:
        response.close()


def test_a_large_read_comes_gzipped_and_decodes_to_the_same_json(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _fleet(session, clock)
    headers, body = _raw(client, MAP, {**auth["viewer"], "Accept-Encoding": "gzip"})
    plain_headers, plain = _raw(client, MAP, {**auth["viewer"], "Accept-Encoding": "identity"})
    assert len(plain) > GZIP_MIN_BYTES
    assert headers["content-encoding"] == "gzip"
    assert "accept-encoding" in headers["vary"].lower()
    assert int(headers["content-length"]) == len(body) < len(plain) / 3
    assert json.loads(gzip.decompress(body)) == json.loads(plain)
    assert json.loads(plain)["cluster"] == "alpha" and len(json.loads(plain)["nodes"]) == 24
    # The security headers go on either way.
    for answer in (headers, plain_headers):
        assert answer["x-content-type-options"] == "nosniff"
        assert answer["cache-control"] == "no-store"


def test_without_accept_encoding_a_large_read_is_plain(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _fleet(session, clock)
    for asked in ({}, {"Accept-Encoding": "identity"}, {"Accept-Encoding": "br"}):
        headers, body = _raw(client, MAP, {**auth["viewer"], **asked})
        assert "content-encoding" not in headers, asked
        assert json.loads(body)["cluster"] == "alpha"


def test_a_small_read_and_the_health_checks_are_not_compressed(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _fleet(session, clock)
    gz = {"Accept-Encoding": "gzip"}
    headers, body = _raw(client, "/api/v1/clusters/alpha", {**auth["viewer"], **gz})
    assert len(body) < GZIP_MIN_BYTES
    assert "content-encoding" not in headers
    assert json.loads(body)["name"] == "alpha"
    for path, expected in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ok"})):
        headers, body = _raw(client, path, gz)
        assert "content-encoding" not in headers
        assert json.loads(body) == expected


def test_the_scrape_comes_gzipped_and_counts_gzipped_reads(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Prometheus asks for gzip; request timing sits outside the compression, so a
    gzipped read is timed like any other."""
    _fleet(session, clock)
    client.get(MAP, headers={**auth["viewer"], "Accept-Encoding": "gzip"})
    headers, body = _raw(client, "/metrics", {**auth["viewer"], "Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip"
    assert headers["content-type"].startswith("text/plain")
    text = gzip.decompress(body).decode()
    assert 'shaper_gpus{cluster="alpha"' in text
    assert (
        'shaper_http_request_duration_seconds_count{method="GET",'
        'route="/api/v1/nodes/map",status="2xx"} 1.0'
    ) in text


def test_an_event_stream_is_passed_on_as_it_is_sent() -> None:
    """No route streams events today; one added later must not be held back by gzip
    (which would buffer it) whatever the client accepts."""
    app = create_app(Settings(environment="test"))

    def events() -> Iterator[str]:
        for n in range(3):
            yield f"data: {'x' * GZIP_MIN_BYTES} {n}\n\n"

    @app.get("/test-events")
    def stream() -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    with (
        TestClient(app) as client,
        client.stream("GET", "/test-events", headers={"Accept-Encoding": "gzip"}) as response,
    ):
        chunks = list(response.iter_raw())
        assert "content-encoding" not in response.headers
    assert len(chunks) == 3
    assert chunks[2].decode().endswith(" 2\n\n")
