"""Logging set-up. Secrets never reach a log line: tokens are redacted by a filter."""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(shp_[a-z0-9]+_)[A-Za-z0-9_-]+|(Bearer\s+)\S+")


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + "***", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    if not any(any(isinstance(f, RedactSecrets) for f in h.filters) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(RedactSecrets())
        root.addHandler(handler)
    root.setLevel(level)
