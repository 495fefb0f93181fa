"""Block-job durations predicted from the jobs that finished before, with the error tracked.

The estimator is a shrunken per-group median, in log space so that a 10-minute job and a
10-hour job weigh the same:

* target: ``log(actual / estimate)`` when the user gave an estimate (a walltime, a time
  limit) — the ratio is what users get wrong consistently — else ``log(actual)``; jobs with
  and without an estimate are learnt apart;
* groups, from broad to narrow: all jobs → team → team and kind → team, kind, GPU count
  (in powers of two) and GPU model. Each level's value is its median over its last
  ``window`` jobs pulled toward its parent's by ``shrink`` pseudo-jobs:
  ``(n · median + shrink · parent) / (n + shrink)``, so one odd job in a new group moves the
  prediction little and a group with history follows its own;
* with no history at all: the user's estimate, else ``default_s``.

Why not a regression library: the features are a handful of categories, the history
drifts (teams change their mix), and a median with shrinkage is robust to the heavy tails
of real traces (Philly's durations span five orders of magnitude) without tuning.

``observe`` first scores the prediction the predictor would have made for the finished
job, then learns from it: ``error`` is an honest online (prequential) MAE and MAPE.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

DEFAULT_S = 3600.0
SHRINK = 5.0
WINDOW = 500
# A job shorter than this is an instant failure more than a duration: kept out of MAPE,
# which it would dominate, but not out of MAE.
MAPE_FLOOR_S = 60.0


@dataclass(frozen=True, slots=True)
class JobFeatures:
    team: str
    kind: str
    gpus: int
    gpu_model: str | None = None
    estimate_s: float | None = None

    @property
    def has_estimate(self) -> bool:
        return self.estimate_s is not None and self.estimate_s > 0


@dataclass(slots=True)
class ErrorStats:
    count: int = 0
    abs_error_s: float = 0.0
    mape_count: int = 0
    abs_pct: float = 0.0

    def add(self, predicted_s: float, actual_s: float) -> None:
        self.count += 1
        self.abs_error_s += abs(predicted_s - actual_s)
        if actual_s >= MAPE_FLOOR_S:
            self.mape_count += 1
            self.abs_pct += abs(predicted_s - actual_s) / actual_s

    @property
    def mae_s(self) -> float:
        return self.abs_error_s / self.count if self.count else math.nan

    @property
    def mape(self) -> float:
        return self.abs_pct / self.mape_count if self.mape_count else math.nan


def _gpu_bucket(gpus: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(gpus, 1))))


def _keys(job: JobFeatures) -> tuple[tuple[object, ...], ...]:
    """Group keys, broadest first."""
    base: tuple[object, ...] = (job.has_estimate,)
    return (
        base,
        (*base, job.team),
        (*base, job.team, job.kind),
        (*base, job.team, job.kind, _gpu_bucket(job.gpus), job.gpu_model),
    )


@dataclass
class DurationPredictor:
    shrink: float = SHRINK
    window: int = WINDOW
    default_s: float = DEFAULT_S
    _history: dict[tuple[object, ...], deque[float]] = field(default_factory=dict)
    _error: ErrorStats = field(default_factory=ErrorStats)
    _error_by_team: dict[str, ErrorStats] = field(default_factory=dict)
    # Predictions since the last observation: a queue holds many jobs of few groups.
    _memo: dict[JobFeatures, float] = field(default_factory=dict)

    def predict(self, job: JobFeatures) -> float:
        """Expected run time in seconds."""
        memo = self._memo.get(job)
        if memo is None:
            memo = self._memo[job] = self._predict(job)
        return memo

    def _predict(self, job: JobFeatures) -> float:
        value: float | None = None
        for key in _keys(job):
            seen = self._history.get(key)
            if not seen:
                break  # a narrower group has no more history than its parent
            median = statistics.median(seen)
            n = len(seen)
            if value is None:
                value = median
            else:
                value = (n * median + self.shrink * value) / (n + self.shrink)
        if job.has_estimate:
            assert job.estimate_s is not None
            return job.estimate_s * (math.exp(value) if value is not None else 1.0)
        return math.exp(value) if value is not None else self.default_s

    def observe(self, job: JobFeatures, actual_s: float) -> None:
        """A job finished after ``actual_s`` seconds of running: score, then learn."""
        predicted = self.predict(job)
        self._memo.clear()
        self._error.add(predicted, actual_s)
        self._error_by_team.setdefault(job.team, ErrorStats()).add(predicted, actual_s)
        actual = max(actual_s, 1.0)
        if job.has_estimate:
            assert job.estimate_s is not None
            target = math.log(actual / job.estimate_s)
        else:
            target = math.log(actual)
        for key in _keys(job):
            self._history.setdefault(key, deque(maxlen=self.window)).append(target)

    @property
    def error(self) -> ErrorStats:
        return self._error

    def error_by_team(self) -> dict[str, ErrorStats]:
        return dict(self._error_by_team)
