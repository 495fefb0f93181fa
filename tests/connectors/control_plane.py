"""A stand-in for the control plane's telemetry endpoint, for the runner's protocol tests.

It keeps the contract of ``POST /api/v1/clusters/{cluster}/telemetry`` (documented in
``wire/telemetry.py``): bearer token with scope ``connector:<cluster>``; a replayed
``(session, seq)`` acknowledged as a duplicate, an older seq never accepted answered 409
``out_of_order``; a delta that does not follow the last accepted push of its session 409
``snapshot_required``; a snapshot from a new session supersedes the old one, whose pushes
then get 409 ``stale_session``. Tests can queue forced answers (500, 422, …) and connection
failures ahead of it. The real endpoint is tested in tests/app.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from wire.telemetry import TelemetryDelta, TelemetrySnapshot


@dataclass
class Received:
    kind: str
    seq: int
    session: str
    body: dict[str, Any]
    status: int


@dataclass
class ControlPlane:
    cluster: str = "hpc-a"
    token: str = "secret-token"
    # Forced answers, consumed one per request before the contract logic: an int status,
    # or an exception instance to raise as a transport failure.
    script: list[int | Exception] = field(default_factory=list)
    # Requests to handle normally and then fail as if the answer got lost on the way back.
    lose_answers: int = 0
    received: list[Received] = field(default_factory=list)
    session: str | None = None
    last_seq: int | None = None
    accepted_seqs: set[int] = field(default_factory=set)
    superseded: set[str] = field(default_factory=set)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.status == 200]

    def handle(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            response = self._handle(request)
            if self.lose_answers:
                self.lose_answers -= 1
                raise httpx.ReadTimeout("answer lost", request=request)
            return response

    def _handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != f"/api/v1/clusters/{self.cluster}/telemetry":
            return httpx.Response(404, json={"detail": "cluster is not registered"})
        if request.method != "POST":
            return httpx.Response(405)
        body = json.loads(request.content)
        forced = self.script.pop(0) if self.script else None
        if isinstance(forced, Exception):
            self._record(body, 0)
            raise forced
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return self._answer(body, 401, {"detail": "bad token"})
        if forced is not None:
            return self._answer(body, forced, {"detail": f"forced {forced}"})
        push = (TelemetrySnapshot if body["kind"] == "snapshot" else TelemetryDelta).model_validate(
            body
        )
        if push.connector_session in self.superseded:
            return self._answer(body, 409, _error("stale_session"))
        same_session = push.connector_session == self.session
        if same_session and self.last_seq is not None and push.seq <= self.last_seq:
            if push.seq in self.accepted_seqs:
                return self._answer(body, 200, self._ack(push.seq, duplicate=True))
            return self._answer(body, 409, _error("out_of_order"))
        if isinstance(push, TelemetryDelta) and (
            not same_session or self.last_seq is None or push.seq != self.last_seq + 1
        ):
            return self._answer(body, 409, _error("snapshot_required"))
        self._apply(push)
        return self._answer(body, 200, self._ack(push.seq))

    def _apply(self, push: TelemetrySnapshot | TelemetryDelta) -> None:
        if isinstance(push, TelemetrySnapshot):
            self.nodes, self.jobs = {}, {}
            if self.session is not None and push.connector_session != self.session:
                self.superseded.add(self.session)
                self.accepted_seqs = set()
        else:
            for name in push.removed_nodes:
                self.nodes.pop(name)
            for job_id in push.removed_jobs:
                self.jobs.pop(job_id)
        for node in push.nodes:
            self.nodes[node.name] = node.model_dump(mode="json")
        for job in push.jobs:
            self.jobs[job.external_id] = job.model_dump(mode="json")
        self.session, self.last_seq = push.connector_session, push.seq
        self.accepted_seqs.add(push.seq)

    def _ack(self, seq: int, *, duplicate: bool = False) -> dict[str, Any]:
        return {"cluster": self.cluster, "seq": seq, "duplicate": duplicate}

    def _answer(self, body: dict[str, Any], status: int, payload: Any) -> httpx.Response:
        self._record(body, status)
        return httpx.Response(status, json=payload)

    def _record(self, body: dict[str, Any], status: int) -> None:
        self.received.append(
            Received(
                kind=body["kind"],
                seq=body["seq"],
                session=body["connector_session"],
                body=body,
                status=status,
            )
        )


def _error(code: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": code.replace("_", " ")}}
