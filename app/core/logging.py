"""Logging set-up. Secrets never reach a log line: a filter redacts tokens, and the SQL
parameters a database error would quote, in messages and in tracebacks alike."""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(shp_[a-z0-9]+_)[A-Za-z0-9_-]+|(Bearer\s+)\S+")
# SQLAlchemy appends "[parameters: (...)]" to a failed statement's message; engines hide
# them (app.core.db), and this catches any engine made without that.
_SQL_PARAMETERS = re.compile(r"\[parameters: .*?\](?=\n|$)", re.DOTALL)


def redact(text: str) -> str:
    text = _TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)
    return _SQL_PARAMETERS.sub("[parameters: redacted]", text)


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            # Format the traceback here, redacted; formatters reuse ``exc_text``.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    if not any(any(isinstance(f, RedactSecrets) for f in h.filters) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(RedactSecrets())
        root.addHandler(handler)
    root.setLevel(level)
