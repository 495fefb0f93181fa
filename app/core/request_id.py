"""A request id for every API request: the client's ``X-Request-ID`` when it is a sane
token (letters, digits, ``._:-``, at most 64: what the audit log stores), else a fresh
one. It is answered in the response's ``X-Request-ID``, stamped on every log line written
while the request is served (``app.core.logging.REQUEST_ID``) and kept in the audit
record of what the request changed, so one id finds a request in the proxy's log, the
client's and Shaper's."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.logging import REQUEST_ID

HEADER = b"x-request-id"
VALID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(HEADER, b"").decode("latin-1")
        request_id = given if VALID.match(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
