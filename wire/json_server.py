"""A small JSON-over-HTTP(S) server on the standard library, for the two endpoints that a
node's side and a cluster's side serve themselves: the node agent's API (agent.api) and
the checkpoint-restore admission webhook (connectors.kubernetes.restore_webhook). It lives
in ``wire`` because both use it and neither may import the other (DESIGN.md: agent and
connectors are peers).

:class:`JsonHandler` does the TLS handshake in the connection's own thread and under its
timeout (a client slow to shake hands holds up no other), reads a body within its
``max_body`` (411 without a length, 413 beyond it) and answers JSON; :class:`JsonServer`
runs each connection in a daemon thread and drops failed handshakes silently (the client
sees them).
"""

from __future__ import annotations

import json
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class JsonServer(ThreadingHTTPServer):
    # A connection's thread does not keep the process alive once the server is shut down.
    daemon_threads = True
    block_on_close = False
    tls: ssl.SSLContext | None = None  # None: plain HTTP

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a failed handshake or a dropped connection: the client sees it


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Callers keep their connections open; an idle one is closed after this many seconds,
    # so that no handler thread waits on it for ever.
    timeout = 30
    max_body = 64 * 1024
    server: JsonServer

    def setup(self) -> None:
        if self.server.tls is not None:
            self.request.settimeout(self.timeout)
            self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.server.tls is not None:
                self.request.close()  # the TLS socket; the server closes the one under it

    def read_body(self) -> bytes | None:
        """The request's body; None once the request is answered 411 or 413."""
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self.answer(411, {"error": "Content-Length: missing"})
            return None
        if not 0 < length <= self.max_body:
            self.answer(413, {"error": f"Content-Length: must be 1..{self.max_body}"})
            return None
        return self.rfile.read(length)

    def answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        return


def server_tls(certfile: str | Path, keyfile: str | Path) -> ssl.SSLContext:
    """A server's TLS context: TLS 1.2 at least, this certificate and key."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.load_cert_chain(str(certfile), str(keyfile))
    return tls
