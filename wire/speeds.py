"""A job's own speed on GPU models, as its owner writes it for any scheduler.

A job gains from a faster GPU more or less than the catalogue's speeds say (Gavel measured
a ResNet-18 at 0.08 of its V100 speed on a K80, a language model at 0.23, and some jobs
faster on a P100 than on a V100). Its owner can say so under one key, :data:`SPEEDS_KEY`,
wherever their scheduler keeps a job's own words, as for its residency (wire.residency):
Kubernetes and Kueue in the annotations of the Job, its pod template or its pods; Armada in
the job's annotations; Ray in the submission's metadata; Slurm in a word of the job's
``--comment`` (``shaper.io/speeds=H100=2.5,A100-80G=1``). The value is
``MODEL=SPEED[,MODEL=SPEED…]``: a model as the connector names GPU models (a catalogue
name, or what the connector maps to one: a Slurm GRES type through ``gpu_model_aliases``, a
GPU product label), a speed on the catalogue's scale (``GpuModel.relative_speed``: the
reference GPU, A100, is 1.0) in [``MIN_JOB_SPEED``, ``MAX_JOB_SPEED``] = [0.01, 100].

:func:`read_speeds` keeps what it can read and logs the rest: a typo in one speed must
not cost the job the others, nor its telemetry. It goes into ``JobReport.speeds``; the
runner then leaves out models no node of the cluster has (connectors.runner).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from wire.telemetry import MAX_JOB_SPEED, MAX_JOB_SPEEDS, MIN_JOB_SPEED

logger = logging.getLogger(__name__)

SPEEDS_KEY = "shaper.io/speeds"
MAX_MODEL_NAME = 64


def read_speeds(
    value: object, *, job: str, model_name: Callable[[str], str] = str
) -> dict[str, float]:
    """``"H100=2.5,A100-80G=1"`` → ``{"H100": 2.5, "A100-80G": 1.0}``; ``model_name`` maps
    the connector's names to catalogue ones. An entry that is not ``MODEL=SPEED`` with a
    speed in [MIN_JOB_SPEED, MAX_JOB_SPEED] is left out, with a warning (once per job and
    entry); a later entry for the same model wins; at most MAX_JOB_SPEEDS are kept. None
    or empty: no speeds."""
    if value is None or value == "":
        return {}
    speeds: dict[str, float] = {}
    for entry in str(value).split(","):
        name, equals, number = (part.strip() for part in entry.partition("="))
        speed = _number(number)
        model = model_name(name)[:MAX_MODEL_NAME] if name else ""
        if not (equals and model and MIN_JOB_SPEED <= speed <= MAX_JOB_SPEED):
            _warn_once(
                job,
                entry.strip(),
                "job %s: ignoring %r in %s (MODEL=SPEED, a speed in [%g, %g])",
                job,
                entry.strip(),
                SPEEDS_KEY,
                MIN_JOB_SPEED,
                MAX_JOB_SPEED,
            )
            continue
        if model not in speeds and len(speeds) >= MAX_JOB_SPEEDS:
            _warn_once(
                job, "", "job %s: %s names more than %d models", job, SPEEDS_KEY, MAX_JOB_SPEEDS
            )
            break
        speeds[model] = speed
    return speeds


# (job, entry) pairs already logged: a connector reads every job at every push, and the
# owner's typo is worth one line, not one a minute. Bounded: forgotten all at once when full.
_WARNED: set[tuple[str, str]] = set()
_WARNED_MAX = 10_000


def _warn_once(job: str, entry: str, message: str, *args: object) -> None:
    if (job, entry) in _WARNED:
        return
    if len(_WARNED) >= _WARNED_MAX:
        _WARNED.clear()
    _WARNED.add((job, entry))
    logger.warning(message, *args)


def _number(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        return math.nan
    return number if math.isfinite(number) else math.nan
