"""Federated moves on Armada: ``SupportsSubmit`` and ``SupportsArrivalCheck``
(connectors.base) over Armada's submit API and event streams.

``submit`` submits the job a ``SubmitSpec`` describes (connectors.armada.specs) as a new
workload, annotated ``shaper.io/move: <move name>``, into a followed job set (Armada
reports a job only through its job set's events, so one the connector does not follow
would never be seen): the spec's own queue and job set when this connector follows that
queue (a job from another Armada), else the first followed job set of its team's queue
(``shaper.io/team``, the queue a team maps to: connectors.armada.reports), else
``move_job_set``; with none, it is refused for good. ``hold`` is the connector's own hold:
the job goes into the cordoned ``hold_queue`` (job set of the same name, home queue
annotated) and a ``release`` (``start``) moves it into its queue. ``nodes`` pins it as a
plan's start does (``node_label`` and its executor's ``executor_label``).

Idempotent by name twice over: a job carrying the move's annotation in the followed job
sets is answered as it is (not held or pinned again: it may have been released since),
and the submission's ``client_id`` is derived from the name, so Armada itself answers a
resend whose job the events do not show yet (Armada publishes them through Pulsar, after
the submit's answer) with the job it made (``internal/armada/submit`` deduplication).

**"Ran"**, one rule for ``check_arrival`` and ``withdraw`` (:func:`ran`): the connector saw
the job running (its ``running`` event), or it succeeded. Armada's states (``JobState`` in
``submit.proto``: QUEUED, LEASED, PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED,
PREEMPTED, REJECTED) map as:

* queued (a held copy in the hold queue too), leased, pending, running: accepted — Armada
  holds the job in a state it runs from; a lease returned or expired queues it again;
* succeeded, or failed, cancelled or preempted after it ran: accepted, the move took place
  (its failure is the job's own); ``withdraw`` then refuses for good, so the home copy is
  not released to run a second time;
* failed (REJECTED: a ``failed`` event with cause ``Rejected``; or any failure before a
  run), cancelled or preempted before it ran: rejected, and ``withdraw`` finds nothing to
  cancel;
* not in the followed job sets' events yet: not yet known.

A withdraw cancels the move's job while it waits or runs (``CancelJobs``) and answers its
id; None when no job of the move arrived or it ended without running.

Tested against the project's Armada test server (tests/support/armada_server.py), not a
real Armada, which cannot run here.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from connectors.armada.jobs import HOME_QUEUE_ANNOTATION, ArmadaJob, Phase, current_attempts
from connectors.armada.reports import TEAM_LABEL
from connectors.armada.specs import MOVE_MARK, spec_item, spec_queue
from connectors.arrival import not_yet, rejected
from connectors.base import ConnectorError, check_move_name
from wire.telemetry import SubmitSpec

if TYPE_CHECKING:
    import threading

    from connectors.armada.client import ArmadaApi
    from connectors.armada.config import ArmadaConnectorConfig, JobSetRef

logger = logging.getLogger(__name__)


def ran(job: ArmadaJob) -> bool:
    """Whether the job ran here: its running event was seen, or it succeeded (Armada
    sends ``succeeded`` only for a job that ran)."""
    return job.started_at is not None or job.phase is Phase.succeeded


def move_client_id(name: str) -> str:
    """The client id of move ``name``'s submission: Armada answers a second submission
    with it, in the same queue, with the job the first one made."""
    return "shaper-move-" + hashlib.sha256(name.encode()).hexdigest()[:40]


class ArmadaMoves:
    """``submit``/``withdraw``/``check_arrival`` of the Armada connector: a mixin of its
    capabilities (it needs the connector's ``api``, ``cluster``, ``config``, lock, jobs,
    ``catch_up``, ``_hold_queue`` and ``_pin``)."""

    if TYPE_CHECKING:
        api: ArmadaApi
        cluster: str
        config: ArmadaConnectorConfig
        _lock: threading.RLock
        _jobs: dict[str, ArmadaJob]

        def catch_up(self) -> None: ...
        def _hold_queue(self, external_id: str) -> str: ...
        def _pin(self, external_id: str, nodes: list[str] | None) -> dict[str, str | None]: ...

    def submit(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str:
        """SupportsSubmit: submit the job of ``spec`` here as move ``name``; its workload
        id (the id of the job made now, which a release keeps)."""
        check_move_name(name)
        what = f"submit {name} to {self.cluster}"
        with self._lock:
            found = self.moved_job(name)
            if found is not None:
                logger.info("%s: job %s was submitted for it before", what, found.workload_id)
                return found.workload_id
            item = spec_item(spec, portable_namespace=self.config.portable_namespace, what=what)
            landing = self._landing(spec, team=item.labels.get(TEAM_LABEL), what=what)
            queue = self._hold_queue(name) if hold else landing.queue
            item.annotations[MOVE_MARK] = name
            if hold:
                item.annotations[HOME_QUEUE_ANNOTATION] = landing.queue
            if nodes:
                self._check_nodes(nodes, what=what)
                for key, value in self._pin(name, nodes).items():
                    for pod in item.pod_specs:
                        if value is None:
                            pod.nodeSelector.pop(key, None)
                        else:
                            pod.nodeSelector[key] = value
            item.client_id = move_client_id(name)
            (job_id,) = self.api.submit(queue, landing.job_set, [item])
            logger.info(
                "%s: submitted job %s to job set %s in queue %s%s%s",
                what,
                job_id,
                landing.job_set,
                queue,
                f", pinned to {','.join(nodes)}" if nodes else "",
                ", held" if hold else "",
            )
            return job_id

    def withdraw(self, name: str) -> str | None:
        """SupportsSubmit: cancel the job submitted here as move ``name``; its workload id,
        or None when none waits or runs (never arrived, ended without running, or withdrawn
        already). A job of the move that ran here (:func:`ran`) and ended is a non-retryable
        error: the move took place, and its source copy must not run a second time."""
        check_move_name(name, step="withdraw")
        what = f"withdraw {name} from {self.cluster}"
        with self._lock:
            job = self.moved_job(name)
            if job is None:
                logger.info("%s: no job of that move waits or runs here", what)
                return None
            if job.terminal:
                if ran(job):
                    raise ConnectorError(
                        f"{what}: job {job.job_id} of this move already ran here and ended "
                        f"({job.phase.value}): the move took place, so its source copy must "
                        "not run again",
                        retryable=False,
                    )
                logger.info("%s: job %s ended (%s) without running", what, job.job_id, job.phase)
                return None
            self.api.cancel(job.queue, job.job_set, job.job_id)
            logger.info("%s: cancelled job %s (%s)", what, job.job_id, job.phase.value)
            return job.workload_id

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: whether Armada holds the moved job ``external_id`` (a
        workload id) in a state it runs from, by the followed job sets' events now."""
        with self._lock:
            self.catch_up()
            job = current_attempts(self._jobs).get(external_id)
        if job is None:
            raise not_yet(f"Armada reports no job {external_id} in the followed job sets yet")
        seen = f"job {external_id} is {job.phase.value} in queue {job.queue}" + (
            f" ({job.reason})" if job.reason else ""
        )
        if not job.terminal:
            return seen
        if ran(job):
            return f"{seen}, after it ran here: the move took place"
        raise rejected(f"{seen} without having run")

    # --- lookups ---------------------------------------------------------------------------

    def moved_job(self, name: str) -> ArmadaJob | None:
        """The newest job of the workload submitted here as move ``name`` (its later
        attempts, a release or a requeue, carry the mark on), after a catch-up."""
        self.catch_up()
        marked = {
            job.workload_id
            for job in self._jobs.values()
            if job.spec.annotations.get(MOVE_MARK) == name
        }
        if not marked:
            return None
        current = current_attempts(self._jobs)
        # One workload per move: a client id makes a second submission answer the first.
        return current[min(marked)]

    def _landing(self, spec: SubmitSpec, *, team: str | None, what: str) -> JobSetRef:
        """The followed job set a moved job goes to (module docstring)."""
        followed = self.config.job_sets
        queue, job_set = spec_queue(spec)
        if own := next((r for r in followed if (r.queue, r.job_set) == (queue, job_set)), None):
            return own
        for wanted in (queue, team):
            found = next((r for r in followed if wanted is not None and r.queue == wanted), None)
            if found is not None:
                return found
        if self.config.move_job_set is not None:
            return self.config.move_job_set
        asked = ", ".join(f"{k} {v}" for k, v in (("queue", queue), ("team", team)) if v)
        raise ConnectorError(
            f"{what}: no followed job set takes it ({asked or 'it names no queue or team'}; "
            "move_job_set is not set)",
            retryable=False,
        )

    def _check_nodes(self, nodes: list[str], *, what: str) -> None:
        declared = {node.name for node in self.config.nodes}
        unknown = [node for node in nodes if declared and node not in declared]
        if unknown:
            raise ConnectorError(
                f"{what}: no node {', '.join(unknown)} is declared here (config nodes)",
                retryable=False,
            )
