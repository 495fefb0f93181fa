"""All configuration in one place: environment variables with the ``SHAPER_`` prefix.

With nothing set, Shaper runs on the *embedded default*: SQLite under ``./shaper-data/``,
tasks in-process, bound to 127.0.0.1. Setting ``SHAPER_DATABASE_URL`` to a
``postgresql+psycopg://`` URL and ``SHAPER_BROKER_URL`` to ``redis://…`` switches to
Postgres and Celery workers.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path("shaper-data")
DEFAULT_SCHEDULER_START_WAIT_S = 300.0  # see Settings.scheduler_start_wait_s
MIN_SAMPLE_RETENTION_DAYS = 32  # see Settings.sample_retention_days


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHAPER_", env_nested_delimiter="__")

    environment: Literal["development", "test", "production"] = "development"
    data_dir: Path = DEFAULT_DATA_DIR
    # Out of repr(): either may carry a password (postgresql://user:pass@…, redis://:pass@…).
    database_url: str | None = Field(default=None, repr=False)
    broker_url: str | None = Field(default=None, repr=False)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # Failed authentications per client address before it gets 429 (app.core.ratelimit).
    auth_failure_limit: int = Field(default=20, ge=1)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # How long a process remembers a token that authenticated (app.tokens.cache): a
    # revocation made through another process takes up to this long to reach it. 0: off.
    auth_cache_s: float = Field(default=5.0, ge=0, le=60)
    cycle_period_s: float = Field(default=30.0, gt=0)
    # Node samples (GPU busy and memory, CPU, memory) older than this are deleted
    # (app.utilization.retention); utilization over their periods comes from the roll-up.
    # The idle diagnosis reads them back 31 days: a shorter retention would delete what it
    # reads and call busy GPUs idle, so 32 (a day past it, for the deletion's own timing).
    sample_retention_days: int = Field(default=35, ge=MIN_SAMPLE_RETENTION_DAYS)
    # Overrides every saga step's timeout (impatient tests, slow sites); unset: the
    # per-step defaults in app.actions.saga.STEP_TIMEOUT_S.
    action_step_timeout_s: float | None = Field(default=None, gt=0)
    # How often the beat's sweep dispatches approved actions and sends again the saga steps
    # whose timeout passed (app.actions.tasks.sweep): a step is sent again up to this long
    # after its timeout. Impatient tests shorten it with the step timeouts.
    action_sweep_period_s: float = Field(default=5.0, gt=0)
    # How long a migration waits for the scheduler (Slurm) to start a requeued job on its
    # target; Slurm holds a requeued job for its cred_expire (120 s by default) first.
    scheduler_start_wait_s: float = Field(default=DEFAULT_SCHEDULER_START_WAIT_S, gt=0)
    # Where the dashboard reads `shaper sim` results; unset: <data_dir>/sim-results, where
    # `shaper sim compare|table|replay` write by default.
    sim_results_dir: Path | None = None
    # The largest trace file POST /simulations takes (413 beyond it), counted as it arrives.
    sim_upload_max_mb: float = Field(default=64.0, gt=0)
    # Uploads received (and checked by their loader) at once on a host, every API process
    # together: one more is refused (429) before it is read. Each streams to disk and its
    # check reads it whole in a process of its own.
    sim_upload_max_concurrent: int = Field(default=2, ge=1, le=64)
    # How long an upload may send nothing before it is refused (408) and its place freed:
    # without it a stalled client holds one of those places for ever. At most 30 min, so
    # that a file still being received is never as old as the sweep's hour
    # (``app.simulations.runs.UPLOAD_STALE``).
    sim_upload_idle_timeout_s: float = Field(default=60.0, gt=0, le=1800)
    # The cluster map reads each GPU's latest sample from gpu_latest_samples (kept by the
    # ingest whatever this says) instead of every sample of its 10-minute window: the same
    # reply, about 15x less work with agents reporting every 15 s (README, "Each GPU's
    # latest sample"). False reads the window, as before the table.
    map_from_latest_samples: bool = True
    # The dashboard's built scripts and styles answered with their precompressed copies
    # (make web writes .br and .gz) and Cache-Control (a year for content-hashed names,
    # no-cache for the others): app.core.static. On by default since 2026-12-05 (13 % fewer
    # bytes before the overview's cards, 23 % over HTTPS; time unchanged on loopback).
    # False: served as they are, compressed by the gzip middleware on each request, no
    # Cache-Control.
    web_precompressed: bool = True
    # A federation group of two or more clusters is solved once per shaping period and
    # each member's plan is its slice of that solve (app.federation.planning.member_plan),
    # so that a job gets one decision: a start at home or a move. False: each member is
    # planned alone, then the group solved again for its cross-cluster moves only. On by
    # default since 2026-12-05 (README, "One solve per group"; python -m bench.solve_once:
    # one decision per job, where the members' own solves and the group's moves could
    # take the same node); a member whose scheduler cannot be told where a job goes
    # (Kueue, Ray) is solved with the rest, its jobs never moved within it (Job.migratable).
    federation_solve_once: bool = True
    # Requests that may use the database served at once by each process; the rest wait
    # their turn (app.core.admission). Below the 15 pooled connections a process has (5 +
    # 10 overflow), so that one is always free for a request that waits for it.
    max_requests_in_flight: int = Field(default=14, ge=1, le=10_000)
    log_level: str = "INFO"
    # "json": one JSON object per line (ts, level, logger, message, and the request, plan,
    # action and cluster ids when a line has them), for log shippers; "text" for people.
    log_format: Literal["text", "json"] = "text"
    # Dev convenience only: refused in production (see validator below).
    allow_public_bind: bool = False

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.environment == "production":
            if self.resolved_database_url.startswith("sqlite"):
                raise ValueError("production needs SHAPER_DATABASE_URL pointing at PostgreSQL")
            if self.broker_url is None:
                raise ValueError("production needs SHAPER_BROKER_URL (Redis or RabbitMQ)")
        if self.host not in ("127.0.0.1", "::1", "localhost") and not self.allow_public_bind:
            raise ValueError(
                f"refusing to bind to {self.host}: set SHAPER_ALLOW_PUBLIC_BIND=true "
                "to listen beyond this machine (put TLS in front)"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'shaper.db'}"

    @property
    def resolved_sim_results_dir(self) -> Path:
        return self.sim_results_dir or self.data_dir / "sim-results"

    @property
    def tasks_in_process(self) -> bool:
        return self.broker_url is None


@lru_cache
def get_settings() -> Settings:
    return Settings()
