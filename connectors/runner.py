"""Push a connector's telemetry to the control plane, for every connector kind.

The loop, once per ``interval_s`` — or as soon as a connector that can tell
(``SupportsChangeWait``: a Kubernetes watch) reports a change, after ``change_debounce_s``
and no sooner than ``min_push_interval_s`` after the previous cycle began:

1. **Read** ``ClusterState`` from the connector. A retryable :class:`ConnectorError` (the
   scheduler is down) backs off exponentially with jitter and reads again; the next push is
   then a snapshot, because what happened meanwhile is unknown. Nothing partial is pushed:
   a read gives the whole state or nothing. A non-retryable error is fatal.
   Then the connector's ``upkeep`` (``SupportsUpkeep``: Slurm gives back spent
   reservations); a failure there is logged and tried again next cycle.
   A job's speeds on GPU models no node of the cluster has are left out, with a warning
   once per job (:func:`speeds_on_known_models`): its owner wrote them, so a typo must
   not have the whole push refused for a model the control plane's catalogue lacks.
2. **Build** the payload: a :class:`TelemetrySnapshot` when the control plane's view is
   unknown (first push, after a 409, a refused payload, a failed read, or every
   ``resync_interval_s``), else a :class:`TelemetryDelta` of the nodes and jobs that are new
   or changed since the last acknowledged push and the names of those that vanished.
   Every payload has ``seq`` = previous + 1 within this process's ``connector_session``.
3. **Push** ``POST {control_plane}/api/v1/clusters/{cluster}/telemetry``:

   * 2xx — acknowledged (``duplicate: true`` too: the control plane already had it);
   * 409 — the delta does not follow what the control plane has: push a snapshot now;
   * 400/413/422 — the control plane refused the payload, which is our bug: log it and
     resync with a snapshot at the next cycle;
   * 401/403/404 — wrong token, scope or cluster: fatal (:class:`RunnerFatal`);
   * 429, 5xx, connection errors and timeouts — back off and push the same payload again
     (same ``seq``: the control plane drops a replay).

Clock, sleep, session id, jitter and the HTTP transport are injectable for tests.

``main()`` with ``--broker`` also serves the control plane's action steps on Celery queue
``connector.<cluster>`` (connectors.actions) in the same process: see :func:`main`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from connectors import registry
from connectors.base import Connector, ConnectorError, SupportsChangeWait, SupportsUpkeep
from connectors.settings import BROKER_ENV, STATE_DIR_ENV, TOKEN_ENV, ConnectorSettings
from wire.executor import make_executor_app, run_executor_worker
from wire.queues import connector_queue
from wire.redaction import log_to_stderr
from wire.steps import ConnectorStep
from wire.telemetry import (
    ClusterState,
    JobReport,
    NodeReport,
    SchedulerKind,
    TelemetryAck,
    TelemetryDelta,
    TelemetrySnapshot,
)

logger = logging.getLogger(__name__)

Payload = TelemetrySnapshot | TelemetryDelta
# How often a wait for a change looks whether the runner was stopped.
CHANGE_WAIT_SLICE_S = 0.5


def _error_code(response: httpx.Response) -> str | None:
    """The ``error.code`` of a control-plane error body, if it has one."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


class RunnerFatal(Exception):
    """The runner cannot go on (bad token, unknown cluster, unreadable scheduler config)."""


class RunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    control_plane: Annotated[str, Field(min_length=1)]
    cluster: Annotated[str, Field(min_length=1, max_length=128)]
    token: SecretStr
    interval_s: Annotated[float, Field(gt=0)] = 15.0
    backoff_initial_s: Annotated[float, Field(gt=0)] = 1.0
    backoff_max_s: Annotated[float, Field(gt=0)] = 60.0
    request_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    # A full snapshot now and then bounds any drift between the two sides; None: never.
    resync_interval_s: Annotated[float, Field(gt=0)] | None = 600.0
    # After a change that a connector reported (SupportsChangeWait), how long to gather
    # more before pushing: a burst of pod events makes one push, not hundreds.
    change_debounce_s: Annotated[float, Field(ge=0)] = 0.2
    # The least time between the starts of two change-driven pushes: on a busy cluster
    # (pods churning every few milliseconds) the debounce alone would push several times a
    # second and keep the control plane's ingest busy for nothing; changes gathered
    # meanwhile go in the next push. The interval still bounds the wait when nothing changes.
    min_push_interval_s: Annotated[float, Field(ge=0)] = 1.0


@dataclass
class RunnerStats:
    cycles: int = 0
    snapshots_sent: int = 0
    deltas_sent: int = 0
    duplicates: int = 0
    conflicts: int = 0
    refused_payloads: int = 0
    read_failures: int = 0
    push_failures: int = 0


View = tuple[dict[str, NodeReport], dict[str, JobReport]]
# Outcomes of one push that are not an acknowledgement.
_CONFLICT = "conflict"
_REFUSED = "refused"
_STOPPED = "stopped"


def _changed(acked: NodeReport | JobReport | None, now: NodeReport | JobReport) -> bool:
    """Whether a report differs from the acknowledged one. Connectors that read
    incrementally hand back the same object for what did not change: ``is`` settles those
    without comparing every field (10,000 unchanged jobs: ~1.6 ms instead of ~16 ms)."""
    return acked is not now and acked != now


class TelemetryRunner:
    def __init__(
        self,
        connector: Connector,
        config: RunnerConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        session_id: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.connector = connector
        self.config = config
        self.session_id = session_id or uuid.uuid4().hex
        self.stats = RunnerStats()
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._next_seq = 0
        # What the control plane has acknowledged; None: unknown, so the next push is a snapshot.
        self._acked: View | None = None
        self._last_snapshot_at: float | None = None
        self._speeds_warned: set[str] = set()  # jobs whose unknown speeds were logged
        self._cycle_started_at: float | None = None
        self._url = (
            f"{config.control_plane.rstrip('/')}/api/v1/clusters/"
            f"{quote(config.cluster, safe='')}/telemetry"
        )
        self._http = httpx.Client(timeout=config.request_timeout_s, transport=transport)

    # --- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._http.close()

    def run(self, *, max_cycles: int | None = None) -> None:
        """Loop until :meth:`stop` (or ``max_cycles``); raises :class:`RunnerFatal`."""
        while not self.stopping and (max_cycles is None or self.stats.cycles < max_cycles):
            self.run_once()
            if self.stopping or (max_cycles is not None and self.stats.cycles >= max_cycles):
                break
            self._wait_between_cycles()

    def _wait_between_cycles(self) -> None:
        """The interval, or less when the connector reports a change (``SupportsChangeWait``):
        then a short debounce, so that a burst of changes makes one push."""
        if not isinstance(self.connector, SupportsChangeWait):
            self._sleep(self.config.interval_s)
            return
        remaining = self.config.interval_s
        while remaining > 0 and not self.stopping:
            # Slices, so that stop() is seen while the connector waits.
            step = min(remaining, CHANGE_WAIT_SLICE_S)
            if self.connector.wait_for_change(step):
                since_last = (
                    self._monotonic() - self._cycle_started_at
                    if self._cycle_started_at is not None
                    else float("inf")
                )
                self._sleep(
                    max(
                        self.config.change_debounce_s,
                        self.config.min_push_interval_s - since_last,
                    )
                )
                self.connector.wait_for_change(0)  # what the wait gathered is in this push
                return
            remaining -= step

    def run_once(self) -> TelemetryAck | None:
        """One cycle: read (retrying), push (retrying); ``None`` when stopped or refused."""
        self.stats.cycles += 1
        self._cycle_started_at = self._monotonic()
        state = self._read()
        if state is None:
            return None
        upkeep(self.connector)
        state = speeds_on_known_models(state, self._speeds_warned)
        outcome = self._push(*self._build(state))
        if outcome == _CONFLICT and not self.stopping:
            # The control plane lost track of this session: the snapshot goes out at once.
            outcome = self._push(*self._build(state))
        return outcome if isinstance(outcome, TelemetryAck) else None

    # --- phases ----------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        # 2.0 ** n: a float (int ** int is typed Any, since a negative power is a float).
        ceiling = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2.0**attempt)
        return ceiling * (0.5 + 0.5 * self._rng.random())

    def _read(self) -> ClusterState | None:
        attempt = 0
        while not self.stopping:
            try:
                return self.connector.read_state()
            except ConnectorError as error:
                if not error.retryable:
                    raise RunnerFatal(
                        f"cannot read {self.connector.kind} cluster {self.connector.cluster}: "
                        f"{error}"
                    ) from error
                self.stats.read_failures += 1
                self._acked = None  # what changed meanwhile is unknown: resync
                delay = self._backoff(attempt)
                logger.warning("reading the scheduler failed (%s); again in %.1f s", error, delay)
                attempt += 1
                self._sleep(delay)
        return None

    def _build(self, state: ClusterState) -> tuple[Payload, View]:
        nodes = {node.name: node for node in state.nodes}
        jobs = {job.external_id: job for job in state.jobs}
        resync_due = (
            self.config.resync_interval_s is not None
            and self._last_snapshot_at is not None
            and self._monotonic() - self._last_snapshot_at >= self.config.resync_interval_s
        )
        common: dict[str, Any] = {
            "connector_session": self.session_id,
            "seq": self._next_seq,
            "sent_at": self._clock(),
            "samples": state.samples,
        }
        view = (nodes, jobs)
        if self._acked is None or resync_due:
            return TelemetrySnapshot(**common, nodes=state.nodes, jobs=state.jobs), view
        acked_nodes, acked_jobs = self._acked
        delta = TelemetryDelta(
            **common,
            nodes=[node for name, node in nodes.items() if _changed(acked_nodes.get(name), node)],
            jobs=[job for job_id, job in jobs.items() if _changed(acked_jobs.get(job_id), job)],
            removed_nodes=sorted(set(acked_nodes) - set(nodes)),
            removed_jobs=sorted(set(acked_jobs) - set(jobs)),
        )
        return delta, view

    def _push(self, payload: Payload, view: View) -> TelemetryAck | str:
        # Serialised once, by pydantic-core straight to JSON bytes: for a 10,000-job snapshot
        # about 35 ms, where model_dump + json.dumps took about 155 ms and built the whole
        # document as Python objects first.
        body = payload.model_dump_json().encode()
        headers = {
            "Authorization": f"Bearer {self.config.token.get_secret_value()}",
            "Content-Type": "application/json",
        }
        attempt = 0
        while not self.stopping:
            try:
                response = self._http.post(self._url, content=body, headers=headers)
            except httpx.HTTPError as error:
                self._retry_later(f"control plane unreachable ({error!r})", attempt)
                attempt += 1
                continue
            status = response.status_code
            if 200 <= status < 300:
                return self._accepted(payload, view, response)
            if status == 409:
                if _error_code(response) == "stale_session":
                    # A newer connector took the cluster over: resyncing would only be
                    # refused again, push after push. Stop; a restart is a new session.
                    raise RunnerFatal(
                        f"superseded by a newer connector for {self.config.cluster}: "
                        f"{response.text[:300]}"
                    )
                self.stats.conflicts += 1
                logger.warning("control plane answered 409 to seq %d: resync", payload.seq)
                self._forget(payload)
                return _CONFLICT
            if status in (401, 403, 404):
                raise RunnerFatal(self._fatal_message(status, response))
            if status in (400, 413, 422):
                self.stats.refused_payloads += 1
                logger.error(
                    "control plane refused %s seq %d (%d): %s; resyncing with a snapshot",
                    payload.kind,
                    payload.seq,
                    status,
                    response.text[:2000],
                )
                self._forget(payload)
                return _REFUSED
            self._retry_later(f"control plane answered {status}: {response.text[:200]}", attempt)
            attempt += 1
        return _STOPPED

    def _retry_later(self, reason: str, attempt: int) -> None:
        self.stats.push_failures += 1
        delay = self._backoff(attempt)
        logger.warning("%s; pushing the same payload again in %.1f s", reason, delay)
        self._sleep(delay)

    def _forget(self, payload: Payload) -> None:
        # The seq is spent; the control plane's view is unknown until a snapshot lands.
        self._acked = None
        self._next_seq = payload.seq + 1

    def _accepted(self, payload: Payload, view: View, response: httpx.Response) -> TelemetryAck:
        try:
            ack = TelemetryAck.model_validate(response.json())
        except (ValueError, ValidationError) as error:
            # Accepted all the same: the status says so; only the body is odd.
            logger.warning("ack of seq %d has an odd body: %s", payload.seq, error)
            ack = TelemetryAck(cluster=self.config.cluster, seq=payload.seq)
        if ack.duplicate:
            self.stats.duplicates += 1
        if isinstance(payload, TelemetrySnapshot):
            self.stats.snapshots_sent += 1
            self._last_snapshot_at = self._monotonic()
        else:
            self.stats.deltas_sent += 1
        self._acked = view
        self._next_seq = payload.seq + 1
        return ack

    def _fatal_message(self, status: int, response: httpx.Response) -> str:
        detail = response.text[:300]
        if status == 404:
            return (
                f"control plane has no telemetry endpoint for cluster {self.config.cluster!r} at "
                f"{self._url} (404: {detail}); check --control-plane and --cluster"
            )
        return (
            f"control plane refused the token ({status}: {detail}); it needs the scope "
            f"connector:{self.config.cluster}"
        )


# --- command line ----------------------------------------------------------------------------


def speeds_on_known_models(state: ClusterState, warned: set[str]) -> ClusterState:
    """``state`` with each job's speeds (JobReport.speeds) kept on the GPU models its
    cluster's nodes have, in the nodes' spelling. A job's owner writes them (a Slurm
    comment, an annotation), and a model the catalogue lacks would have the control plane
    refuse the whole push; one no node has could not be planned on anyway. The rest is
    logged once per job (in ``warned``). The state is returned as it is when nothing is
    left out, so that incremental connectors' unchanged reports stay the same objects
    (``_changed``)."""
    if warned:  # forget jobs that are gone
        warned.intersection_update(job.external_id for job in state.jobs)
    models = {node.gpu_model for node in state.nodes if node.gpu_model}
    # Case aside, as the control plane takes names (app.telemetry.model_names): a speed
    # on "H100" is one on the nodes' "h100", and is sent in their spelling.
    spelling = {model.lower(): model for model in sorted(models)}
    jobs = list(state.jobs)
    changed = False
    for position, job in enumerate(jobs):
        if not job.speeds or job.speeds.keys() <= models:
            continue
        dropped = sorted(model for model in job.speeds if model.lower() not in spelling)
        if dropped and job.external_id not in warned:
            warned.add(job.external_id)
            logger.warning(
                "job %s: leaving out its speeds on %s: no node of this cluster has that GPU "
                "model (known: %s)",
                job.external_id,
                ", ".join(dropped),
                ", ".join(sorted(models)) or "none",
            )
        kept = {
            spelling[model.lower()]: speed
            for model, speed in job.speeds.items()
            if model.lower() in spelling
        }
        jobs[position] = job.model_copy(update={"speeds": kept})
        changed = True
    return state.model_copy(update={"jobs": jobs}) if changed else state


def upkeep(connector: object) -> None:
    """The connector's housekeeping (``SupportsUpkeep``), once; a failure only waits for
    the next round."""
    if not isinstance(connector, SupportsUpkeep):
        return
    try:
        for line in connector.upkeep():
            logger.info("%s", line)
    except ConnectorError as error:
        logger.warning("upkeep failed (%s); again next round", error)


def option_argument(text: str) -> tuple[str, Any]:
    """argparse type of ``--set KEY=VALUE``: the value as JSON when it parses, else text."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m connectors.runner --kind slurm --cluster hpc-a --control-plane URL …``

    With ``--broker`` (or ``SHAPER_BROKER_URL``) the same process also serves the control
    plane's scheduler-level action steps on Celery queue ``connector.<cluster>``
    (connectors.actions): the Celery worker runs in the main thread, the telemetry loop in
    a background thread, and SIGTERM/SIGINT stop both. ``--actions-only`` skips telemetry.
    The environment is read here, once (connectors.settings.ConnectorSettings), as the
    options' defaults.
    """
    settings = ConnectorSettings()
    parser = argparse.ArgumentParser(prog="connectors.runner", description=__doc__.split("\n")[0])
    parser.add_argument("--kind", required=True, choices=[kind.value for kind in SchedulerKind])
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--control-plane", help="the control plane's URL (telemetry)")
    parser.add_argument("--token", default=settings.token, help=f"or {TOKEN_ENV}")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between pushes")
    parser.add_argument(
        "--min-push-interval",
        type=float,
        default=1.0,
        help="least seconds between pushes that a watched change triggers (Kubernetes)",
    )
    parser.add_argument(
        "--set",
        type=option_argument,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="connector option (JSON values allowed), e.g. --set rest_url=http://h:6820",
    )
    parser.add_argument(
        "--broker",
        default=settings.broker_url,
        metavar="URL",
        help=f"Celery broker (or {BROKER_ENV}): also serve action steps on connector.<cluster>",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"the action step journal (or {STATE_DIR_ENV}; "
        "default ./shaper-data/connector-<cluster>)",
    )
    parser.add_argument(
        "--actions-only", action="store_true", help="serve action steps, push no telemetry"
    )
    args = parser.parse_args(argv)
    log_to_stderr(logging.INFO)  # secrets redacted, as in the control plane's logs
    if not args.token:
        parser.error(f"--token (or {TOKEN_ENV}) is required")
    if args.actions_only and not args.broker:
        parser.error(f"--actions-only needs --broker (or {BROKER_ENV})")
    if not args.actions_only and not args.control_plane:
        parser.error("--control-plane is required (unless --actions-only)")

    kind = SchedulerKind(args.kind)
    importlib.import_module(f"connectors.{kind.value}")  # registers the kind
    try:
        # One connector for both threads: telemetry reads it while the action worker acts
        # through it. A second would double what it holds (a Kubernetes connector's
        # informer caches: every node and pod) and its connections, and a simulated
        # cluster must be one. Each kind is safe to share: the simulator locks; Slurm runs
        # its CLI per call and shares an httpx.Client, which httpx documents as shareable
        # between threads; Kubernetes' informers already share one ApiClient (urllib3's
        # thread-safe pool; the client keeps no per-request state), and the action
        # worker's solo pool runs one step at a time.
        connector = registry.create(kind, cluster=args.cluster, **dict(args.set))
        action_connector = connector if args.broker else None
    except (LookupError, ValidationError, ValueError, TypeError) as error:
        print(f"connector: bad configuration for {kind.value}: {error}", file=sys.stderr)
        return 2
    runner = None
    if not args.actions_only:
        runner = TelemetryRunner(
            connector,
            RunnerConfig(
                control_plane=args.control_plane,
                cluster=args.cluster,
                token=args.token,
                interval_s=args.interval,
                min_push_interval_s=args.min_push_interval,
            ),
        )
    if action_connector is None:
        assert runner is not None
        logger.info("telemetry only (no --broker): no action steps are served")
        return _push_telemetry(runner, kind)
    state_dir: Path = args.state_dir or settings.state_dir_for(args.cluster)
    return _serve_actions(args, kind, action_connector, runner, state_dir=state_dir)


def _push_telemetry(runner: TelemetryRunner, kind: SchedulerKind) -> int:
    def _stop(signum: int, frame: FrameType | None) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    logger.info(
        "pushing %s cluster %s as session %s", kind.value, runner.config.cluster, runner.session_id
    )
    try:
        runner.run()
    except RunnerFatal as error:
        print(f"connector: {error}", file=sys.stderr)
        return 2
    finally:
        runner.close()
    return 0


class _StoppedEarly(BaseException):
    """SIGTERM/SIGINT before the Celery worker took over the signals."""


def _serve_actions(
    args: argparse.Namespace,
    kind: SchedulerKind,
    connector: Any,
    runner: TelemetryRunner | None,
    *,
    state_dir: Path,
) -> int:
    """The Celery worker in this (the main) thread, telemetry in a background thread.

    A fatal telemetry error (bad token, unknown cluster) stops the worker too, so the
    process exits and its supervisor sees it; an unreachable control plane only retries.
    """
    from kombu.utils.url import maybe_sanitize_url

    from connectors.actions import ConnectorStepExecutor

    executor = ConnectorStepExecutor(connector, cluster=args.cluster, state_dir=state_dir)
    queue = connector_queue(args.cluster)
    # Answers go with the connector's token (scope connector:<cluster>): the control plane
    # accepts a step's answer only from the cluster it was sent to.
    app = make_executor_app(
        broker=args.broker,
        queue=queue,
        steps=ConnectorStep,
        handle=executor.handle,
        token=args.token,
        # This runner prints its own fatal errors to stderr after the worker stops.
        redirect_stdouts=False,
    )
    failures: list[str] = []

    def _stop_before_the_worker(signum: int, frame: FrameType | None) -> None:
        # Celery installs its own handlers (a warm shutdown) once the worker starts.
        raise _StoppedEarly

    signal.signal(signal.SIGTERM, _stop_before_the_worker)
    signal.signal(signal.SIGINT, _stop_before_the_worker)

    def _push() -> None:
        assert runner is not None
        try:
            runner.run()
        except RunnerFatal as error:
            failures.append(str(error))
        except Exception as error:  # a bug: stop the process rather than run half of it
            logger.exception("telemetry stopped")
            failures.append(repr(error))
        if failures:
            logger.error("telemetry failed (%s): stopping the action worker too", failures[-1])
            os.kill(os.getpid(), signal.SIGTERM)

    telemetry = None
    stop_upkeep = threading.Event()
    if runner is not None:
        telemetry = threading.Thread(target=_push, name="telemetry", daemon=True)
        telemetry.start()
    elif isinstance(connector, SupportsUpkeep):
        # Without telemetry nothing else would tidy what the connector holds.
        def _upkeep() -> None:
            while not stop_upkeep.wait(args.interval):
                upkeep(connector)

        threading.Thread(target=_upkeep, name="upkeep", daemon=True).start()
    logger.info(
        "serving %s action steps on queue %s (broker %s, journal %s) and %s",
        kind.value,
        queue,
        maybe_sanitize_url(args.broker),
        state_dir,
        "no telemetry (--actions-only)"
        if runner is None
        else f"pushing telemetry to {args.control_plane} as session {runner.session_id}",
    )
    try:
        run_executor_worker(app, queue=queue)
    except _StoppedEarly:
        logger.info("stopped before the action worker had started")
    finally:
        stop_upkeep.set()
        if runner is not None and telemetry is not None:
            runner.stop()
            telemetry.join(timeout=runner.config.request_timeout_s + 5)
            runner.close()
        close = getattr(connector, "close", None)
        if close is not None:
            close()
    if failures:
        print(f"connector: {failures[-1]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
