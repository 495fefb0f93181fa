"""Idle GPU-hours per cause, integrated over time from instantaneous diagnoses.

The state between two changes is constant, so a diagnosis held over ``[start, end)`` adds
its GPUs × the duration; an interval that crosses a bucket boundary is split there, so every
figure is also available per bucket (hours by default, counted from ``origin``). Idle and
capacity are added from the same diagnoses, so the causes add up to the idle GPU-hours
(up to floating-point rounding) by construction; the tests check it independently.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from solver.diagnosis.causes import IdleCause
from solver.diagnosis.classify import Diagnosis

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class IdleRow:
    cluster: str
    bucket: int
    gpu_model: str
    team: str | None
    cause: IdleCause
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class CapacityRow:
    cluster: str
    bucket: int
    gpu_model: str
    capacity_gpu_hours: float
    busy_gpu_hours: float


class IdleHours:
    """Accumulates diagnoses over time; read it with ``rows`` and the totals."""

    def __init__(self, *, bucket_s: float = HOUR_S, origin: float = 0.0) -> None:
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        self.bucket_s = bucket_s
        self.origin = origin
        self._idle: defaultdict[tuple[str, int, str, str | None, IdleCause], float] = defaultdict(
            float
        )
        self._capacity: defaultdict[tuple[str, int, str], float] = defaultdict(float)
        self._busy: defaultdict[tuple[str, int, str], float] = defaultdict(float)
        self._last: (
            tuple[Diagnosis, list[tuple[tuple[str, str | None, IdleCause], list[float]]]] | None
        ) = None

    def add(self, diagnosis: Diagnosis, *, cluster: str, start: float, end: float) -> None:
        """Hold ``diagnosis`` over ``[start, end)`` (seconds on the same clock as origin)."""
        shares = self._shares(diagnosis)
        for bucket, seconds in self._split(start, end):
            for (model, team, cause), counts in shares:
                key = (cluster, bucket, model, team, cause)
                # Each share added apart, in the diagnosis' order, as one add per share.
                total = self._idle[key]
                for gpus in counts:
                    total += gpus * seconds
                self._idle[key] = total
            for model, gpus in diagnosis.capacity_by_model.items():
                self._capacity[(cluster, bucket, model)] += gpus * seconds
                self._busy[(cluster, bucket, model)] += (
                    diagnosis.busy_by_model.get(model, 0) * seconds
                )

    def _shares(
        self, diagnosis: Diagnosis
    ) -> list[tuple[tuple[str, str | None, IdleCause], list[float]]]:
        """The diagnosis' idle GPUs per (model, team, cause), in order; kept for the last
        diagnosis, which a caller holds over many intervals."""
        if self._last is not None and self._last[0] is diagnosis:
            return self._last[1]
        grouped: dict[tuple[str, str | None, IdleCause], list[float]] = {}
        for share in diagnosis.idle:
            grouped.setdefault((share.gpu_model, share.team, share.cause), []).append(share.gpus)
        shares = list(grouped.items())
        self._last = (diagnosis, shares)
        return shares

    def _split(self, start: float, end: float) -> Iterable[tuple[int, float]]:
        t = start
        while end - t > 0:
            bucket = math.floor((t - self.origin) / self.bucket_s)
            bucket_end = self.origin + (bucket + 1) * self.bucket_s
            # A float boundary can land a hair before t; step into the next bucket then.
            if bucket_end <= t:
                bucket += 1
                bucket_end += self.bucket_s
            stop = min(end, bucket_end)
            yield bucket, stop - t
            t = stop

    def rows(self) -> list[IdleRow]:
        return [
            IdleRow(cluster, bucket, model, team, cause, seconds / HOUR_S)
            for (cluster, bucket, model, team, cause), seconds in sorted(
                self._idle.items(), key=lambda item: _sort_key(item[0])
            )
            if seconds > 0
        ]

    def capacity_rows(self) -> list[CapacityRow]:
        rows = []
        for (cluster, bucket, model), seconds in sorted(self._capacity.items()):
            busy = self._busy[(cluster, bucket, model)]
            rows.append(CapacityRow(cluster, bucket, model, seconds / HOUR_S, busy / HOUR_S))
        return rows

    def hours_by_cause(self) -> dict[IdleCause, float]:
        totals = dict.fromkeys(IdleCause, 0.0)
        for row in self.rows():
            totals[row.cause] += row.gpu_hours
        return totals

    @property
    def capacity_gpu_hours(self) -> float:
        return math.fsum(self._capacity.values()) / HOUR_S

    @property
    def busy_gpu_hours(self) -> float:
        return math.fsum(self._busy.values()) / HOUR_S

    @property
    def idle_gpu_hours(self) -> float:
        """Measured: capacity − busy, computed apart from the causes."""
        return self.capacity_gpu_hours - self.busy_gpu_hours


def _sort_key(key: tuple[str, int, str, str | None, IdleCause]) -> tuple[str, int, str, str, int]:
    cluster, bucket, model, team, cause = key
    return cluster, bucket, model, team or "", list(IdleCause).index(cause)
