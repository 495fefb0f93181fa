"""Loaded at start-up (``PYTHONPATH``) by a process whose wall clock a test skews: from here
on ``time.time`` and ``datetime.now`` read ``SHAPER_TEST_CLOCK_SKEW_S`` seconds off, as on
a host whose clock is wrong. Monotonic clocks are left alone (they are not wall time).
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time

_skew = float(os.environ.get("SHAPER_TEST_CLOCK_SKEW_S", "0"))

if _skew:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _skew
    _time.time_ns = lambda: _real_time_ns() + int(_skew * 1_000_000_000)

    class _SkewedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> _SkewedDatetime:
            return super().now(tz) + _datetime.timedelta(seconds=_skew)

        @classmethod
        def utcnow(cls) -> _SkewedDatetime:
            return cls.now(_datetime.UTC).replace(tzinfo=None)

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
