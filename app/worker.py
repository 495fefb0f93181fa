"""The Celery application: queues, beat schedule, and the embedded in-process mode.

With ``SHAPER_BROKER_URL`` set, tasks go to a broker (Redis or RabbitMQ) and run on
``shaper worker`` processes; ``shaper beat`` (or ``--beat`` on one worker) fires the periodic
ones. With no broker (the embedded default) tasks run in the calling process and
:class:`InProcessBeat` fires the periodic ones from a thread of ``shaper serve``.

Queues: ``control`` (control-plane work: cycles, saga steps' bookkeeping, executors'
reports); ``connector.<cluster>`` (scheduler-level saga steps, consumed by the cluster's
connector) and ``agent.<cluster>.<node>`` (process-level steps, consumed by the node agent,
``shaper agent worker``). Messages to the last two are sent by task name
(``shaper.agent.restore``…), so neither side imports the other; the names, like the
messages, are defined once in ``wire``.

The app is built on first use (:func:`get_celery_app`, from the process's settings), not at
import: importing this module reads no environment. ``celery_app`` (for importers) and
``celery`` (what ``celery -A app.worker`` looks up) are the same app, built when first
asked for.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any

from celery import Celery

from app.core.config import Settings, get_settings
from wire.queues import CONTROL_QUEUE

log = logging.getLogger(__name__)
STALE_CHECK_PERIOD_S = 60.0
# Folds the utilization roll-up's deltas (PostgreSQL): reads sum the ones not folded yet,
# so this bounds their cost, not their exactness.
ROLLUP_FOLD_PERIOD_S = 10.0
# Deletes node samples past SHAPER_SAMPLE_RETENTION_DAYS (app.utilization.retention).
SAMPLE_RETENTION_PERIOD_S = 3600.0


def make_celery(settings: Settings) -> Celery:
    app = Celery(
        "shaper",
        broker=settings.broker_url or "memory://",
        include=[
            "app.telemetry.tasks",
            "app.shaping.tasks",
            "app.actions.tasks",
            "app.utilization.tasks",
        ],
    )
    app.conf.update(
        task_always_eager=settings.tasks_in_process,
        task_eager_propagates=True,
        task_default_queue=CONTROL_QUEUE,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        beat_schedule={
            "mark-stale-connectors": {
                "task": "app.telemetry.tasks.mark_stale_connectors",
                "schedule": STALE_CHECK_PERIOD_S,
            },
            "action-sweep": {
                "task": "app.actions.tasks.sweep",
                # dispatches approved actions, times out unanswered saga steps
                "schedule": settings.action_sweep_period_s,
            },
            "shaping-cycle": {
                "task": "app.shaping.tasks.run_shaping_cycles",
                "schedule": settings.cycle_period_s,
            },
            "fold-rollup-deltas": {
                "task": "app.utilization.tasks.fold_rollup_deltas",
                "schedule": ROLLUP_FOLD_PERIOD_S,
            },
            "prune-samples": {
                "task": "app.utilization.tasks.prune_samples",
                "schedule": SAMPLE_RETENTION_PERIOD_S,
            },
        },
    )
    return app


@lru_cache(maxsize=1)
def get_celery_app() -> Celery:
    """The control plane's Celery app, built once per process from its settings."""
    return make_celery(get_settings())


def __getattr__(name: str) -> Celery:
    # The module attributes `celery_app` and `celery`, built on first access (PEP 562).
    if name in ("celery_app", "celery"):
        return get_celery_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class InProcessBeat(threading.Thread):
    """Fires the beat schedule in-process, for the embedded default (no broker)."""

    def __init__(self, app: Celery) -> None:
        super().__init__(name="shaper-beat", daemon=True)
        self.app = app
        self._stopping = threading.Event()

    def run(self) -> None:
        entries: dict[str, Any] = dict(self.app.conf.beat_schedule)
        periods = {name: float(entry["schedule"]) for name, entry in entries.items()}
        due = dict.fromkeys(entries, 0.0)
        elapsed = 0.0
        tick = min(periods.values(), default=60.0)
        while not self._stopping.wait(0 if elapsed == 0 else tick):
            for name, entry in entries.items():
                if elapsed >= due[name]:
                    try:
                        self.app.tasks[entry["task"]].apply()
                    except Exception:  # a failing periodic task must not stop the others
                        log.exception("periodic task %s failed", name)
                    due[name] = elapsed + periods[name]
            elapsed += tick

    def stop(self) -> None:
        self._stopping.set()


def start_in_process_beat(settings: Settings) -> InProcessBeat | None:
    """On the embedded default, fire the beat schedule from a thread of this process
    (`shaper serve`, `shaper demo`); with a broker, `shaper worker --beat` does it."""
    if not settings.tasks_in_process:
        return None
    celery_app = get_celery_app()
    celery_app.loader.import_default_modules()  # the task modules a worker would import
    beat = InProcessBeat(celery_app)
    beat.start()
    log.info("in-process beat: shaping cycle every %.0f s", settings.cycle_period_s)
    return beat
