"""Federated moves on Armada: ``SupportsSubmit`` and ``SupportsArrivalCheck``
(connectors.base) over Armada's submit API and event streams.

``submit`` submits the job a ``SubmitSpec`` describes (connectors.armada.specs) as a new
workload, annotated ``shaper.io/move: <move name>``, into a followed job set (Armada
reports a job only through its job set's events, so one the connector does not follow
would never be seen): the spec's own queue and job set when this connector follows that
queue (a job from another Armada), else the first followed job set of its team's queue
(``shaper.io/team``, the queue a team maps to: connectors.armada.reports), else
``move_job_set``; with none, it is refused for good, as is a job whose namespace (Armada's
``default`` when it names none) is not in ``accept_namespaces`` (empty by default: no
moved job is taken until the operator names the namespaces that may run one), and a
member of an Armada gang (connectors.armada.gangs: a gang moves only whole). ``hold`` is
the connector's own hold: the job goes into the cordoned ``hold_queue`` (job set of the
same name, home queue annotated) and a ``release`` (``start``) moves it into its queue.
``nodes`` pins it as a plan's start does (``node_label`` and its executor's ``executor_label``).

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

Two cancels are the connector's own, and neither is the job's end (:func:`outcome`), so
each says why (``CancelJobs``' reason). Armada's event API leaves the reason off the
``cancelled`` event; its query API (``GetJobDetails``) answers it as ``cancel_reason``. The
connector remembers the reasons of its own cancels, and asks Armada about a cancelled job
it does not remember (after a restart); where Armada does not serve that query (it needs
Lookout's database), such a job counts as cancelled by someone else:

* **withdrawn** (:func:`withdraw_reason`): the move's withdraw cancelled the copy, running
  or not. Not "ran": a withdraw resent (at-least-once delivery) answers as the first did,
  the job's id; the confirm rejects it (nothing runs here any more).
* **replaced** (:data:`REPLACED_REASON`): a release, hold or requeue cancels a job to
  submit the workload again, often into another queue, and the events of each queue's job
  set come on their own stream (through Pulsar): the new job's may come after the old
  job's ``cancelled``. While the newest job seen is one so replaced, the next is on its
  way: the confirm says not yet known and the withdraw is retried, instead of "ended
  without running" (the confirm rejecting a healthy move, or the withdraw missing a job
  that is queued).

A withdraw cancels the move's job while it waits or runs (``CancelJobs``) and answers its
id, also when asked again; None when no job of the move arrived or it ended without running.

Tested against the project's Armada test server (tests/support/armada_server.py), not a
real Armada, which cannot run here.
"""

from __future__ import annotations

import hashlib
import logging
from enum import StrEnum
from typing import TYPE_CHECKING

from connectors.armada.gangs import GANG_ID
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


# Why the connector cancelled a job of its own accord: the reason of its CancelJobs, which
# Armada keeps for its query API (module docstring).
REPLACED_REASON = "shaper: cancelled to be submitted again"


def replaced_reason(step_key: str | None = None) -> str:
    """The reason a job is cancelled with to be submitted again; a step that does so for
    several workloads (a job set's move) adds its key, so that its resend tells its own
    cancels from those of another change whose next job is not in the events yet."""
    return REPLACED_REASON if step_key is None else f"{REPLACED_REASON} [step {step_key}]"


def is_replaced(why: str | None) -> bool:
    """Whether a cancel's reason says the job was cancelled to be submitted again."""
    return why is not None and why.startswith(REPLACED_REASON)


# Where Armada runs a job whose submission names no namespace (its submit conversion).
DEFAULT_NAMESPACE = "default"


def withdraw_reason(name: str) -> str:
    """The reason of the cancel by move ``name``'s withdraw."""
    return f"shaper: withdrawn by move {name}"


class Outcome(StrEnum):
    """Where a move's newest job stands, for ``check_arrival`` and ``withdraw`` alike."""

    waiting = "waiting"  # queued, leased, pending or running: Armada runs it from here
    ran = "ran"  # ended after it ran: the move took place
    ended = "ended"  # ended without running: rejected, nothing to withdraw
    withdrawn = "withdrawn"  # cancelled by the move's withdraw
    replaced = "replaced"  # cancelled to be submitted again; the next job is not seen yet


def ran(job: ArmadaJob) -> bool:
    """Whether the job ran here: its running event was seen, or it succeeded (Armada
    sends ``succeeded`` only for a job that ran)."""
    return job.started_at is not None or job.phase is Phase.succeeded


def outcome(job: ArmadaJob, cancelled_for: str | None = None) -> Outcome:
    """The one rule of ``check_arrival`` and ``withdraw``; ``cancelled_for``: the reason
    the job was cancelled with (None: not known, or not cancelled)."""
    if not job.terminal:
        return Outcome.waiting
    if job.phase is Phase.cancelled and cancelled_for:
        why = cancelled_for
        if is_replaced(why):
            return Outcome.replaced
        name = job.spec.annotations.get(MOVE_MARK)
        if name is not None and why == withdraw_reason(name):
            return Outcome.withdrawn
    return Outcome.ran if ran(job) else Outcome.ended


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
        _cancelled_for: dict[str, str]

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
            self._check_namespace(item.namespace or DEFAULT_NAMESPACE, what=what)
            if gang := item.annotations.get(GANG_ID):
                # Its gang would wait for members that never come (they move one by one).
                raise ConnectorError(
                    f"{what}: it is a member of Armada gang {gang}, which moves only whole; "
                    "Shaper moves a gang within its Armada only (a gang carries no submit spec)",
                    retryable=False,
                )
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
        also when an earlier withdraw cancelled it; None when no job of the move arrived or
        it ended without running. A job of the move that ran here (:func:`ran`) and ended
        is a non-retryable error: the move took place, and its source copy must not run a
        second time. A job just replaced by a release is a retryable one (module docstring)."""
        check_move_name(name, step="withdraw")
        what = f"withdraw {name} from {self.cluster}"
        with self._lock:
            job = self.moved_job(name)
            if job is None:
                logger.info("%s: no job of that move waits or runs here", what)
                return None
            found = outcome(job, self._why_cancelled(job))
            if found is Outcome.waiting:
                self._cancel_own(job, withdraw_reason(name))
                logger.info("%s: cancelled job %s (%s)", what, job.job_id, job.phase.value)
                return job.workload_id
            if found is Outcome.withdrawn:
                logger.info("%s: job %s was withdrawn before", what, job.job_id)
                return job.workload_id
            if found is Outcome.replaced:
                raise ConnectorError(
                    f"{what}: job {job.job_id} was cancelled to be submitted again; its "
                    "next job is not in the followed job sets' events yet",
                    retryable=True,
                )
            if found is Outcome.ran:
                raise ConnectorError(
                    f"{what}: job {job.job_id} of this move already ran here and ended "
                    f"({job.phase.value}): the move took place, so its source copy must "
                    "not run again",
                    retryable=False,
                )
            logger.info("%s: job %s ended (%s) without running", what, job.job_id, job.phase)
            return None

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: whether Armada holds the moved job ``external_id`` (a
        workload id) in a state it runs from, by the followed job sets' events now."""
        with self._lock:
            self.catch_up()
            job = current_attempts(self._jobs).get(external_id)
            found = None if job is None else outcome(job, self._why_cancelled(job))
        if job is None or found is None:  # found is None only with job: for the type checker
            raise not_yet(f"Armada reports no job {external_id} in the followed job sets yet")
        seen = f"job {external_id} is {job.phase.value} in queue {job.queue}" + (
            f" ({job.reason})" if job.reason else ""
        )
        if found is Outcome.waiting:
            return seen
        if found is Outcome.replaced:
            raise not_yet(f"{seen}; its next job is not in the followed job sets' events yet")
        if found is Outcome.ran:
            return f"{seen}, after it ran here: the move took place"
        if found is Outcome.withdrawn:
            raise rejected(f"{seen}: withdrawn by its move")
        raise rejected(f"{seen} without having run")

    def _why_cancelled(self, job: ArmadaJob) -> str | None:
        """The reason ``job`` was cancelled with: remembered, else asked of Armada once
        (module docstring); None when it was not cancelled or that cannot be told."""
        if job.phase is not Phase.cancelled:
            return None
        if job.job_id not in self._cancelled_for:
            try:
                reason = self.api.cancel_reason(job.job_id)
            except ConnectorError as error:
                if error.retryable:
                    raise
                logger.warning("armada: why job %s was cancelled: %s", job.job_id, error)
                return None
            # Kept, "" too: a job's cancel reason never changes.
            self._cancelled_for[job.job_id] = reason or ""
        return self._cancelled_for[job.job_id] or None

    def _cancel_own(self, job: ArmadaJob, reason: str) -> None:
        """Cancel ``job`` saying why (module docstring), remembered before the call: a
        cancel whose answer was lost may still have been made."""
        self._cancelled_for[job.job_id] = reason
        self.api.cancel(job.queue, job.job_set, job.job_id, reason=reason)

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

    def _check_namespace(self, namespace: str, *, what: str) -> None:
        """A moved job runs only in a namespace named for it (``accept_namespaces``): its
        pods would run with that namespace's ServiceAccounts and Secrets, which the
        cluster it came from knows nothing of."""
        accepted = self.config.accept_namespaces
        if namespace not in accepted:
            raise ConnectorError(
                f"{what}: namespace {namespace} does not take moved jobs (accept_namespaces: "
                f"{', '.join(accepted) or 'none'}; add it there to allow them)",
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
