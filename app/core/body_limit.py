"""Refuse request bodies over the configured limit before anything parses them."""

from __future__ import annotations

import json
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import error_body


class BodyLimitMiddleware:
    """Answers 413 for a body over ``max_bytes``, whether declared by Content-Length or
    streamed. The body is buffered (at most ``max_bytes``) so the application never sees a
    truncated one.

    ``uploads`` are the (method, path) pairs whose multipart bodies pass through unbuffered:
    their route streams the file to disk and counts it against its own limit."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, uploads: Collection[tuple[str, str]] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = frozenset(uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = list(scope.get("headers") or [])
        types = [value for name, value in raw if name == b"content-type"]
        # Exactly one Content-Type: with two, this and the route could read different ones
        # (a multipart one here, a JSON one there) and the JSON body would pass unbounded.
        if (
            (scope["method"], scope["path"]) in self.uploads
            and len(types) == 1
            and types[0].startswith(b"multipart/form-data")
        ):
            await self.app(scope, receive, send)
            return
        declared = [value for name, value in raw if name == b"content-length"]
        if any(value.isdigit() and int(value) > self.max_bytes for value in declared):
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        message = f"request body over {self.max_bytes} bytes (SHAPER_MAX_BODY_BYTES)"
        payload = json.dumps(error_body("payload_too_large", message, field="body")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
