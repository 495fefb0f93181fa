"""The node agent's HTTP API: ``shaper agent api`` (agent.cli) serves it on the node.

One call, ``POST /v1/kubelet-checkpoints`` (wire.checkpoint_image): checkpoint a pod of
this node through its kubelet and import the checkpoint as images (agent.kubelet). The
Kubernetes and Kueue connectors call it before they preempt a pod that resumes from a
kubelet checkpoint (connectors.kubernetes.node_agent). Every request carries
``Authorization: Bearer <token>`` (``SHAPER_AGENT_API_TOKEN``); answers are JSON, errors
``{"error": "..."}`` naming the field or the cause: 400 a bad request, 401 a missing or
wrong token, 404 a pod not on this node, 409 a pod that is not the one meant or not
running, 502 the kubelet refused or did not answer, 503 containerd is missing, 500 an
import that failed. ``GET /healthz`` answers without a token.

Plain HTTP unless a certificate is given (``SHAPER_AGENT_API_TLS_CERT``/``…_KEY``): a site
serves it over TLS, or on an address only the connector reaches.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.kubelet import CheckpointFailed, KubeletCheckpointer
from wire.checkpoint_image import KUBELET_CHECKPOINT_PATH, KubeletCheckpointRequest
from wire.json_server import JsonHandler, JsonServer, server_tls

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024


def _field_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"{where}: {first['msg']}"


class _Handler(JsonHandler):
    max_body = MAX_BODY
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] == "/healthz":
            self.answer(200, {"ok": True, "node": self.server.checkpointer.node})
        else:
            self.answer(404, {"error": f"path: {self.path.split('?')[0]} is not served"})

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        if path != KUBELET_CHECKPOINT_PATH:
            self.answer(404, {"error": f"path: only POST {KUBELET_CHECKPOINT_PATH}"})
            return
        sent = self.headers.get("Authorization") or ""
        scheme, _, token = sent.partition(" ")
        if scheme.lower() != "bearer" or not token:
            self.answer(401, {"error": "Authorization: a Bearer token is required"})
            return
        if not hmac.compare_digest(token.strip().encode(), self.server.token.encode()):
            self.answer(401, {"error": "Authorization: the token is not this agent's"})
            return
        body = self.read_body()
        if body is None:
            return
        try:
            request = KubeletCheckpointRequest.model_validate_json(body)
        except ValidationError as error:
            self.answer(400, {"error": _field_error(error)})
            return
        started = time.monotonic()
        what = f"checkpoint of pod {request.namespace}/{request.pod}"
        try:
            answer = self.server.checkpointer.checkpoint(request)
        except CheckpointFailed as failed:
            log.warning(
                "%s refused (%d) after %.2f s: %s",
                what,
                failed.status,
                time.monotonic() - started,
                failed,
            )
            self.answer(failed.status, {"error": str(failed)})
            return
        except Exception as error:  # answered, not dropped: the caller must not wait on it
            log.exception("%s failed", what)
            self.answer(500, {"error": f"{what} failed: {type(error).__name__}: {error}"})
            return
        log.info("%s answered in %.2f s: %s", what, time.monotonic() - started, answer.pointer)
        self.answer(200, answer.model_dump(mode="json"))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        # The request line only (never its headers, which carry the token).
        log.info("%s %s", self.address_string(), format % args)


class _Server(JsonServer):
    checkpointer: KubeletCheckpointer
    token: str


def make_server(
    host: str,
    port: int,
    *,
    checkpointer: KubeletCheckpointer,
    token: str,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> ThreadingHTTPServer:
    """The API's server, bound (port 0: any free one, ``server_address`` says which);
    ``serve_forever()`` serves it, ``shutdown()`` then ``server_close()`` stop it."""
    if not token:
        raise ValueError("token: the API needs one (SHAPER_AGENT_API_TOKEN)")
    server = _Server((host, port), _Handler)
    server.checkpointer = checkpointer
    server.token = token
    if tls_cert is not None and tls_key is not None:
        server.tls = server_tls(tls_cert, tls_key)
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="agent-api", daemon=True)
    thread.start()
    return thread
