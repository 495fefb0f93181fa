"""Secrets out of log lines, for every process of Shaper: the control plane
(``app.core.logging``), the node agent and the connectors (``log_to_stderr``).

``redact`` masks Shaper's tokens (the key id stays, so a line still says which token),
bearer tokens in any case, a URL's password (``postgresql://user:***@host``), JSON Web
Tokens (slurmrestd's, a Kubernetes service account's), and the SQL parameters a database
error quotes. ``RedactSecrets`` applies it to a record's message and its traceback.
"""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(shp_[a-z0-9]+_)[A-Za-z0-9_-]+|((?i:bearer)\s+)\S+")
# A URL's password (postgresql://user:pass@host, redis://:pass@host): the user stays.
# A password has no "/" unescaped, which keeps "http://host:8000/users/a@b" as it is.
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s/]+(@)", re.IGNORECASE)
# A JSON Web Token anywhere: header and payload are base64url JSON, so both begin "eyJ".
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")
# SQLAlchemy appends "[parameters: (...)]" to a failed statement's message; engines hide
# them (app.core.db), and this catches any engine made without that.
_SQL_PARAMETERS = re.compile(r"\[parameters: .*?\](?=\n|$)", re.DOTALL)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What stands in for a secret wherever one is hidden (log lines, shown arguments, results).
MASK = "***"


def redact(text: str) -> str:
    text = _TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(2), text)
    text = _JWT.sub(MASK, text)
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


def log_to_stderr(level: str | int = logging.INFO) -> None:
    """``logging.basicConfig`` for a node agent's or a connector's process, with every
    root handler redacting secrets (what the control plane's logging set-up does)."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
