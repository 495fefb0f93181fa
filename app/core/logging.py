"""Logging set-up. Secrets never reach a log line: a filter redacts tokens (Shaper's, bearer
tokens, JWTs), URLs' passwords, and the SQL parameters a database error would quote, in
messages and in tracebacks alike.

Two formats (``SHAPER_LOG_FORMAT``): ``text`` for people, ``json`` — one object per line —
for log shippers. Either way a line carries the ids it is about: the request's
(``REQUEST_ID``, set by ``app.core.request_id``), and ``cluster``, ``plan_id`` and
``action_id`` when the code logging it passes them as ``extra``.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

# Shared with the node agent and the connectors, which do not import the control plane.
from wire.redaction import RedactSecrets, redact

__all__ = [
    "REQUEST_ID",
    "JsonFormatter",
    "RedactSecrets",
    "RequestContext",
    "TextFormatter",
    "redact",
]

# The request a log line was written for (app.core.request_id sets it per request).
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
# Ids a log line may carry as ``extra``, in this order.
CONTEXT_FIELDS = ("request_id", "cluster", "plan_id", "action_id")
# Libraries that log every HTTP request or task run at INFO.
_CHATTY = ("httpx", "httpcore", "celery.app.trace")


class RequestContext(logging.Filter):
    """Stamps the current request's id on every record written while it is served."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info or record.exc_text:
            line["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = [
            f"{field}={value}"
            for field in CONTEXT_FIELDS
            if (value := getattr(record, field, None)) is not None
        ]
        return f"{text} [{' '.join(ids)}]" if ids else text


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    root = logging.getLogger()
    if not any(any(isinstance(f, RedactSecrets) for f in h.filters) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
        handler.addFilter(RedactSecrets())
        handler.addFilter(RequestContext())
        root.addHandler(handler)
    root.setLevel(level)
    for chatty in _CHATTY:  # a line per HTTP call or task run drowns what was decided
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
