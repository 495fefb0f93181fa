"""The last word on any exception a request raises: always the documented JSON body.

Starlette hands an exception no handler claimed to its ``ServerErrorMiddleware``, which
answers 500 in plain text and then re-raises, and uvicorn closes a keep-alive connection
on an exception that escapes the application. This middleware sits inside that one and
never lets an exception out once it has answered: a database that cannot write for now
answers 503 with ``Retry-After`` (``app.core.db_errors``), a value it cannot store 422,
anything else 500 ``internal``, and the connection stays open for the next request.

The 500's body says nothing about the exception; the log has the traceback. SQL
parameters are not in it: engines are made with ``hide_parameters`` (``app.core.db``),
and ``RedactSecrets`` scrubs any that still show up.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.db_errors import classify
from app.core.errors import Internal

logger = logging.getLogger("app.errors")


class UnhandledErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # half a response is out: nothing valid can follow on this connection
                raise
            error = classify(exc)
            where = f"{scope.get('method')} {scope.get('path')}"
            if error is None:
                logger.error("unhandled %s on %s", type(exc).__name__, where, exc_info=exc)
                error = Internal("internal error; the server log has the details")
            else:
                logger.warning("%s on %s: %s", error.code, where, type(exc).__name__)
            response = JSONResponse(error.body(), error.status_code, headers=error.headers())
            await response(scope, receive, send)
