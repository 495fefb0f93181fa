"""The Armada connector: state from each job set's event stream, actions through Armada's
submit API (armada-client).

**Reading.** For every followed job set (config.followed) the connector keeps the id of
the last message it applied and asks ``GetJobSetEvents`` for what came after it
(``watch: false``: the stream ends at the server's last message). Each event is folded
into the job it is about (connectors.armada.jobs) and the resume point moves past it at
once, so a stream that breaks half-way — a dropped connection, a restarting server —
raises a retryable error after what it delivered, and the next read resumes from there:
nothing is applied twice or lost. The first read replays each job set from its start.
A read returns the whole state or raises (``ConnectorError``): an unknown queue is
NOT_FOUND and not retryable.

**Acting.** Armada can cancel, reprioritize and preempt jobs and submit new ones; it
cannot stop a job and start the same job again, pin a queued job elsewhere or hold one.
So the connector does those by cancelling the job and submitting its pods again, marked
as the same workload (connectors.armada.jobs), with a client id that makes Armada answer a
resend with the job it already made (its submit deduplication):

======================  ==================================================================
step / call             what Armada is asked
======================  ==================================================================
requeue(nodes, hold)    cancel, then submit again — pinned to ``nodes[0]`` (node selector
                        ``node_label``, and ``executor_label`` its executor's), with
                        ``SHAPER_RESUME_FROM`` and the annotation ``shaper.io/resume-from``
                        when the saga checkpointed it, into the cordoned ``hold_queue``
                        when ``hold``
hold / release          a queued job moves into / out of the hold queue (cancel, submit)
start(nodes)            Armada cannot start a job; it runs next the job that may run on
                        the free node (node selector) and comes first in its queue
                        (lower priority, then earlier submission). So a held job leaves
                        the hold queue, and a queued one the plan places elsewhere is
                        submitted again, pinned to ``nodes[0]`` and its executor cluster
                        (a node of another executor moves the job there); and it goes to
                        the front of its queue (``ReprioritizeJobs``, or the priority of
                        its resubmission) when a queued job of its queue that could take
                        that node would go first
cancel                  ``CancelJobs`` (``cancel_job_set``: ``CancelJobSet``)
reprioritize            ``ReprioritizeJobs`` of one job or of a whole job set
preempt                 ``PreemptJobs`` (Armada's own preemption: no checkpoint, no resubmit)
move_job_set            a queued job set to another executor cluster: every job cancelled
                        and submitted again with the node selector ``executor_label``, if
                        the target's declared nodes can run each of them (the operator's
                        ``move_job_set`` step: ``POST /clusters/{c}/job-sets/{queue}/
                        {job_set}/move``; its key on every new job, so a resend moves
                        none twice)
submit / withdraw       a federated move's job submitted into a followed job set (held:
                        into the hold queue), with a client id from the move's name; its
                        job cancelled unless it ran (connectors.armada.moves)
confirm (accepted)      ``check_arrival``: the moved job queued, leased, pending, running
                        or having run (connectors.armada.moves)
======================  ==================================================================

A plan reaches Armada's reprioritize and the executor moves through its ``start`` steps
(no step of its own: a plan places jobs on nodes, and these are how Armada is told): a
start puts the job first in its queue where a rival of its queue could take the node,
and a start on a node of another executor cluster is that job's move there — the one
job the plan placed, not its whole job set (``move_job_set`` stays an operator's call).
A job's node selector comes back as its ``required_nodes`` (connectors.armada.reports),
so a plan places a job only where Armada could run it.

Preempt-with-checkpoint is the saga's: its checkpoint step runs on the node agent, then
the requeue step hands the connector the image's pointer (``set_resume_pointer``) and its
idempotency key (``set_step_key``); the key goes on the new job (``shaper.io/stopped-by-
step``), so a resend that finds it stamped on the workload's newest job does nothing more.

**Gangs** (connectors.armada.gangs): the jobs of one ``armadaproject.io/gangId`` are one
Shaper job (external id ``gang:<queue>/<job set>/<gang id>``); every step above that names
it acts on every member — a requeue, hold, start or ``move_job_set`` cancels and submits
them all, with the gang's annotations and one fresh gang id, spread over the plan's nodes
of one executor — and refuses what would split it (a gang not seen whole, nodes of two
executors or of two values of its uniformity label, a resume pointer, a move to another
cluster).

Not supported yet (each says so in its error): suspend/resume (Armada has no suspended
state), requeue ``exclude`` (node anti-affinity), pinning one job (not a gang) to several
nodes, checkpointing a gang, reservations and resize.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from connectors.armada import gangs
from connectors.armada.client import ArmadaApi
from connectors.armada.config import ArmadaConnectorConfig, ExecutorNode
from connectors.armada.jobs import (
    ATTEMPT_ANNOTATION,
    FIRST_SUBMITTED_ANNOTATION,
    HOME_QUEUE_ANNOTATION,
    OWN_PRIORITY_ANNOTATION,
    RESUME_FROM,
    STOPPED_BY_STEP,
    WORKLOAD_ANNOTATION,
    ArmadaJob,
    Phase,
    apply,
    current_attempts,
)
from connectors.armada.moves import (
    REPLACED_REASON,
    ArmadaMoves,
    is_replaced,
    replaced_reason,
)
from connectors.armada.proto import resubmission
from connectors.armada.reports import gang_report, job_report, node_reports
from connectors.armada.specs import submit_spec
from connectors.armada.submission import NewJob, new_job_item
from connectors.base import ConnectorError
from wire.telemetry import ClusterState, SchedulerKind, SubmitSpec

logger = logging.getLogger(__name__)

# Finished jobs stay in the reports this long (the control plane sees how they ended),
# then leave the connector's memory.
FINISHED_RETENTION = timedelta(hours=1)


class ArmadaConnector(ArmadaMoves):
    kind = SchedulerKind.armada

    def __init__(
        self,
        config: ArmadaConnectorConfig,
        *,
        api: ArmadaApi | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self.api = api or ArmadaApi(config)
        self._clock = clock
        # The telemetry thread and the action worker share the connector (runner.main).
        self._lock = threading.RLock()
        self._jobs: dict[str, ArmadaJob] = {}
        # Why the connector cancelled a job of its own accord, by job id (ArmadaMoves).
        self._cancelled_for: dict[str, str] = {}
        self._resume_after: dict[tuple[str, str], str] = {}
        # Handed over by the executor just before a requeue, taken by it.
        self._pointers: dict[str, str | None] = {}
        self._step_keys: dict[str, str] = {}
        # Each job's submit spec, by Armada job id: a job's submission never changes.
        self._specs: dict[str, SubmitSpec | None] = {}

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> ArmadaConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------------

    def resume_point(self, queue: str, job_set: str) -> str:
        """The id of the last message applied from a job set ("" before the first)."""
        with self._lock:
            return self._resume_after.get((queue, job_set), "")

    def catch_up(self) -> None:
        """Apply every job set's messages since the last one applied."""
        with self._lock:
            for ref in self.config.followed():
                where = (ref.queue, ref.job_set)
                after = self._resume_after.get(where, "")
                for message_id, event in self.api.events(ref.queue, ref.job_set, after=after):
                    if event is not None:
                        job = apply(self._jobs.get(event.job_id), event)
                        if job is not None:
                            self._jobs[event.job_id] = job
                    self._resume_after[where] = message_id
            self._forget_finished()

    def _forget_finished(self) -> None:
        horizon = self._clock() - FINISHED_RETENTION
        for job_id, job in list(self._jobs.items()):
            if job.terminal and job.ended_at is not None and job.ended_at < horizon:
                del self._jobs[job_id]
                self._cancelled_for.pop(job_id, None)

    def workloads(self) -> dict[str, ArmadaJob]:
        """Each workload's newest job, by workload id, as of the last catch-up."""
        with self._lock:
            return current_attempts(self._jobs)

    def read_state(self) -> ClusterState:
        observed_at = self._clock()
        with self._lock:
            cordoned = frozenset(q.name for q in self.api.queues() if q.cordoned)
            self.catch_up()
            current = current_attempts(self._jobs)
            singles, found = gangs.gangs(current)
            jobs = [
                job_report(job, self.config, cordoned=cordoned, submit=self._spec(job))
                for job in singles.values()
            ] + [gang_report(gang, self.config, cordoned=cordoned) for gang in found.values()]
            nodes = node_reports(self.config, list(current.values()))
            self._specs = {
                job.job_id: self._specs[job.job_id]
                for job in singles.values()
                if job.job_id in self._specs
            }
        return ClusterState(observed_at=observed_at, nodes=nodes, jobs=jobs)

    def _spec(self, job: ArmadaJob) -> SubmitSpec | None:
        """The spec a job that can move carries (a queued, held or running one)."""
        if not self.config.submit_specs or job.terminal:
            return None
        if job.job_id not in self._specs:
            self._specs[job.job_id] = submit_spec(job, self.config)
        return self._specs[job.job_id]

    def _job(self, external_id: str) -> ArmadaJob:
        self.catch_up()
        job = current_attempts(self._jobs).get(external_id)
        if job is None:
            raise self._unknown("job", external_id)
        return job

    def _unknown(self, what: str, external_id: str) -> ConnectorError:
        followed = ", ".join(f"{r.queue}/{r.job_set}" for r in self.config.followed())
        return ConnectorError(
            f"armada: no {what} {external_id} in the followed job sets ({followed})",
            retryable=False,
        )

    def _gang(self, external_id: str) -> gangs.Gang | None:
        """The gang ``external_id`` names, after a catch-up; None when it names no gang."""
        if not external_id.startswith(gangs.PREFIX):
            return None
        self.catch_up()
        _, found = gangs.gangs(current_attempts(self._jobs))
        gang = found.get(external_id)
        if gang is None:
            raise self._unknown("gang", external_id)
        return gang

    def _settled(self, gang: gangs.Gang, what: str, *, resend: bool = False) -> None:
        """A gang is submitted again only whole, and only once the jobs a last change
        submitted are seen: else the new gang would miss members. ``resend``: the change
        is one whose client ids a delivery cut short after its cancels made already (a
        step's resend): its members cancelled to be submitted again are submitted now,
        and Armada answers any that was made with that job."""
        if not gang.whole:
            raise ConnectorError(
                f"cannot {what} Armada gang {gang.external_id}: {len(gang.members)} of its "
                f"{gang.cardinality} members are in the followed job sets' events yet, and "
                "a gang is submitted again only whole",
                retryable=True,
            )
        replaced = [job.job_id for job in gang.members if is_replaced(self._why_cancelled(job))]
        if replaced and not resend:
            raise ConnectorError(
                f"cannot {what} Armada gang {gang.external_id}: the next jobs of "
                f"{', '.join(replaced)} (cancelled to be submitted again) are not in the "
                "followed job sets' events yet",
                retryable=True,
            )

    def _gang_pins(
        self, gang: gangs.Gang, nodes: list[str] | None, what: str
    ) -> dict[str, dict[str, str | None]]:
        """Each member's node selector change (by workload id) for a gang placed on
        ``nodes``: spread over them (gangs.spread), each pinned to its node and the
        node's executor. Refused when they do not fit, when the nodes span executor
        clusters (Armada runs a gang on one) or differ in the gang's uniformity label."""
        if not nodes:
            return {job.workload_id: {self.config.node_label: None} for job in gang.members}
        capacity = {node.name: node.gpu_count for node in self.config.nodes}
        placed = gangs.spread(gang.members, capacity, nodes)
        if isinstance(placed, str):
            raise ConnectorError(
                f"cannot {what} Armada gang {gang.external_id} on {', '.join(nodes)}: {placed}",
                retryable=False,
            )
        used = [node for node in self.config.nodes if node.name in placed.values()]
        executors = sorted({node.executor for node in used})
        uniform = gang.members[0].spec.annotations.get(gangs.GANG_UNIFORMITY)
        values = {self.config.node_labels(node).get(uniform or "") for node in used}
        why = ""
        if len(executors) > 1:
            why = (
                f"Armada runs a gang on one executor cluster, and they span {', '.join(executors)}"
            )
        elif uniform and (len(values) > 1 or None in values):
            why = f"its members need nodes of one value of {uniform}"
        if why:
            raise ConnectorError(
                f"cannot {what} Armada gang {gang.external_id} on {', '.join(nodes)}: {why}",
                retryable=False,
            )
        executor = executors[0]
        return {
            workload: {self.config.node_label: node, self.config.executor_label: executor}
            for workload, node in placed.items()
        }

    # --- submissions -----------------------------------------------------------------------

    def submit_job(self, queue: str, job_set: str, job: NewJob) -> str:
        """Submit a new job; its Armada job id (also its workload id)."""
        return self.api.submit(queue, job_set, [new_job_item(job)])[0]

    def _submit_again(
        self,
        job: ArmadaJob,
        *,
        purpose: str,
        queue: str,
        node_selector: dict[str, str | None],
        resume_from: str | None = None,
        step_key: str | None = None,
        priority: float | None = None,
        attempt: int | None = None,
        one_of_many: bool = False,
    ) -> str:
        """Cancel ``job`` (unless it ended) and submit its pods again as the next attempt
        of its workload; the new job's id. The client id is derived from the job and the
        purpose (or the step key), so a resend gets the job the first call made.
        ``resume_from`` replaces the job's resume pointer (None: it starts over);
        ``priority``: Armada's priority of the new job (None: the workload's own, as first
        submitted — not a priority an earlier start put it first with); ``attempt``: the
        new job's attempt (None: the next of its workload's; a gang's members all get the
        same, so their fresh gang id is one: connectors.armada.gangs); ``one_of_many``: the
        step key is one step's for several workloads (a job set's move)."""
        if not job.terminal:
            self._cancel_own(job, replaced_reason(step_key) if one_of_many else REPLACED_REASON)
        home = job.spec.annotations.get(HOME_QUEUE_ANNOTATION, job.queue)
        next_attempt = job.spec.attempt + 1 if attempt is None else attempt
        original_gang = gangs.gang_id(job)
        annotations: dict[str, str | None] = {
            WORKLOAD_ANNOTATION: job.workload_id,
            ATTEMPT_ANNOTATION: str(next_attempt),
            HOME_QUEUE_ANNOTATION: home,
            OWN_PRIORITY_ANNOTATION: repr(job.own_priority),  # every digit: it is read back
            RESUME_FROM: resume_from,
        }
        first_submitted = job.first_submitted_at
        if first_submitted is not None:
            annotations[FIRST_SUBMITTED_ANNOTATION] = first_submitted.isoformat()
        if step_key is not None:
            annotations[STOPPED_BY_STEP] = step_key
        if original_gang is not None:
            annotations[gangs.SHAPER_GANG] = original_gang
            annotations[gangs.GANG_ID] = gangs.attempt_gang_id(original_gang, next_attempt)
        seed = step_key or f"{job.job_id}:{purpose}"
        if step_key is not None and (original_gang is not None or one_of_many):
            seed += f":{job.workload_id}"  # one step key, a job per member
        client_id = "shaper-" + hashlib.sha256(seed.encode()).hexdigest()[:40]
        item = resubmission(
            job.spec,
            client_id=client_id,
            priority=job.own_priority if priority is None else priority,
            annotations=annotations,
            node_selector=node_selector,
            resume_from=resume_from,
        )
        (new_id,) = self.api.submit(queue, job.job_set, [item])
        logger.info(
            "armada: %s: job %s of workload %s is now job %s in queue %s",
            purpose,
            job.job_id,
            job.workload_id,
            new_id,
            queue,
        )
        return new_id

    def _home(self, job: ArmadaJob) -> str:
        return job.spec.annotations.get(HOME_QUEUE_ANNOTATION, job.queue)

    def _held(self, job: ArmadaJob) -> bool:
        return job.queue == self.config.hold_queue and not job.terminal

    def _hold_queue(self, external_id: str) -> str:
        if self.config.hold_queue is None:
            raise ConnectorError(
                f"cannot hold Armada job {external_id}: Armada has no held state and no "
                "hold_queue (a cordoned queue to park held jobs in) is configured",
                retryable=False,
            )
        return self.config.hold_queue

    def _pin(self, external_id: str, nodes: list[str] | None) -> dict[str, str | None]:
        """The node selector change for a pin: ``nodes`` None or empty clears an earlier
        pin to a node (not one to an executor cluster); an Armada job is one pod, so it
        runs on one node. A pin to a node also pins its executor cluster (``executor_label``
        set to a declared node's, cleared for another), or an earlier pin to another
        executor — a job set moved there — would leave the job where no node fits."""
        if not nodes:
            return {self.config.node_label: None}
        if len(nodes) > 1:
            raise ConnectorError(
                f"cannot pin Armada job {external_id} to {', '.join(nodes)}: an Armada job "
                "runs one pod, on one node (a gang's members are pinned one by one)",
                retryable=False,
            )
        declared = self._declared(nodes[0])
        return {
            self.config.node_label: nodes[0],
            self.config.executor_label: declared.executor if declared else None,
        }

    def _declared(self, name: str) -> ExecutorNode | None:
        return next((node for node in self.config.nodes if node.name == name), None)

    # --- capabilities (connectors.base) ----------------------------------------------------

    def set_resume_pointer(self, external_id: str, resume_from: str | None) -> None:
        with self._lock:
            self._pointers[external_id] = resume_from

    def set_step_key(self, external_id: str, step_key: str) -> None:
        with self._lock:
            self._step_keys[external_id] = step_key

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        with self._lock:
            resume_from = self._pointers.pop(external_id, None)
            step_key = self._step_keys.pop(external_id, None)
            if exclude:
                raise ConnectorError(
                    f"cannot requeue Armada job {external_id} away from {', '.join(exclude)}: "
                    "node anti-affinity is not supported yet",
                    retryable=False,
                )
            queue_if_held = self._hold_queue(external_id) if hold else None
            gang = self._gang(external_id)
            if gang is not None:
                self._requeue_gang(gang, nodes, queue_if_held, resume_from, step_key)
                return
            selector = self._pin(external_id, nodes)
            job = self._job(external_id)
            if step_key is not None and job.spec.annotations.get(STOPPED_BY_STEP) == step_key:
                logger.info("armada: requeue of %s: done by an earlier delivery", external_id)
                return
            if job.terminal and job.phase is not Phase.cancelled:
                raise ConnectorError(
                    f"cannot requeue Armada job {job.job_id} (workload {external_id}): it "
                    f"has ended ({job.phase.value})",
                    retryable=False,
                )
            self._submit_again(
                job,
                purpose="requeue",
                queue=queue_if_held or self._home(job),
                node_selector=selector,
                resume_from=resume_from,
                step_key=step_key,
            )

    def hold(self, external_id: str) -> None:
        with self._lock:
            hold_queue = self._hold_queue(external_id)
            gang = self._gang(external_id)
            if gang is not None:
                self._hold_gang(gang, hold_queue)
                return
            job = self._job(external_id)
            if self._held(job):
                return
            if job.terminal or job.active:
                raise ConnectorError(
                    f"cannot hold Armada job {job.job_id} (workload {external_id}): it is "
                    f"{job.phase.value}; only a queued job can be held (a requeue with hold "
                    "stops a running one)",
                    retryable=False,
                )
            self._park(job, hold_queue)

    def release(self, external_id: str) -> None:
        self.start(external_id)

    def start(self, external_id: str, *, nodes: list[str] | None = None) -> None:
        """Make Armada run a queued or held job next, on ``nodes`` when given. Armada has
        no call that starts a job; what decides which job its scheduler runs is where the
        job may run (its node selector) and its place in its queue (lower priority first,
        then the earlier submission: ``SchedulingOrderCompare``). So:

        * a held job goes back to its own queue, and a queued one that the plan places on
          another node is submitted again, pinned there (node and executor cluster: a
          node of another executor moves the job to that executor);
        * either way, and for a queued job already where the plan wants it, the job goes
          to the front of its queue when a queued job of that queue that could take those
          nodes would go first (:meth:`_front`); the new job is submitted at that priority,
          one already in the queue is reprioritized (``ReprioritizeJobs``).

        A job that left the queue (leased, pending, running) is left alone: the confirm that
        follows says whether it runs where the plan wanted. A pin to a declared node that
        cannot run the job (its GPUs, the rest of its node selector) is refused, nothing
        changed. Fair share between queues is Armada's: a job of another queue may still
        take the nodes first, and then the confirm fails and the next cycle plans again."""
        with self._lock:
            gang = self._gang(external_id)
            if gang is not None:
                self._start_gang(gang, nodes)
                return
            job = self._job(external_id)
            if job.terminal:
                raise ConnectorError(
                    f"cannot start Armada job {job.job_id} (workload {external_id}): it has "
                    f"ended ({job.phase.value})",
                    retryable=False,
                )
            if job.active:
                return
            # A running job's move releases its copy here with where to resume from
            # (handed over by the executor just before): the resubmission carries it.
            handed = self._pointers.pop(external_id, None)
            selector = self._pin(external_id, nodes) if nodes else {}
            targets = [node for name in nodes or [] if (node := self._declared(name))]
            if targets and (why := self._misfit(job, targets)) is not None:
                raise ConnectorError(
                    f"cannot start Armada job {job.job_id} (workload {external_id}) on "
                    f"{', '.join(nodes or [])}: {why}",
                    retryable=False,
                )
            current = {key: job.spec.node_selector.get(key) for key in selector}
            resubmit = self._held(job) or current != selector or handed is not None
            front = self._front(job, targets, resubmitted=resubmit)
            if resubmit:
                self._submit_again(
                    job,
                    purpose=f"start:{','.join(nodes or [])}",
                    queue=self._home(job),
                    node_selector=selector,
                    # Moving a queued job keeps where it resumes from.
                    resume_from=handed or job.spec.annotations.get(RESUME_FROM),
                    priority=front,
                )
            elif front is not None:
                results = self.api.reprioritize(job.queue, job.job_set, [job.job_id], front)
                _refused(results, f"reprioritize job {job.job_id} to the front of its queue")
                logger.info(
                    "armada: start: job %s (workload %s) goes first in queue %s: priority "
                    "%s, was %s",
                    job.job_id,
                    job.workload_id,
                    job.queue,
                    front,
                    job.priority,
                )

    def _requeue_gang(
        self,
        gang: gangs.Gang,
        nodes: list[str] | None,
        queue_if_held: str | None,
        resume_from: str | None,
        step_key: str | None,
    ) -> None:
        """Stop a gang and queue it again whole: every member cancelled and submitted
        again with the gang's annotations (a fresh gang id), pinned over ``nodes``, into
        the hold queue when held. A resend under the same step key submits only the
        members an earlier delivery did not (their client ids answer the rest anyway)."""
        what = "requeue"
        if resume_from is not None:
            raise ConnectorError(
                f"cannot requeue Armada gang {gang.external_id} with a resume pointer: its "
                "members are separate pods, and Shaper checkpoints one process (a gang is "
                "reported not checkpointable)",
                retryable=False,
            )
        todo = [
            job
            for job in gang.members
            if step_key is None or job.spec.annotations.get(STOPPED_BY_STEP) != step_key
        ]
        if not todo:
            logger.info("armada: requeue of %s: done by an earlier delivery", gang.external_id)
            return
        ended = [
            f"{job.job_id} ({job.phase.value})"
            for job in todo
            if job.terminal and job.phase is not Phase.cancelled
        ]
        if ended:
            raise ConnectorError(
                f"cannot requeue Armada gang {gang.external_id}: members {', '.join(ended)} "
                "have ended",
                retryable=False,
            )
        self._settled(gang, what, resend=step_key is not None)
        selectors = self._gang_pins(gang, nodes, what)
        attempt = max(job.spec.attempt for job in todo) + 1
        for job in todo:
            self._submit_again(
                job,
                purpose="requeue",
                queue=queue_if_held or self._home(job),
                node_selector=selectors[job.workload_id],
                step_key=step_key,
                attempt=attempt,
            )

    def _hold_gang(self, gang: gangs.Gang, hold_queue: str) -> None:
        todo = [job for job in gang.members if not self._held(job)]
        if not todo:
            return
        started = [f"{job.job_id} ({job.phase.value})" for job in todo if job.active]
        ended = [
            f"{job.job_id} ({job.phase.value})"
            for job in todo
            if job.terminal and not is_replaced(self._why_cancelled(job))
        ]
        if started or ended:
            raise ConnectorError(
                f"cannot hold Armada gang {gang.external_id}: members "
                f"{', '.join(started + ended)} are not queued; only a queued gang can be held "
                "(a requeue with hold stops a running one)",
                retryable=False,
            )
        self._settled(gang, "hold")
        attempt = max(job.spec.attempt for job in todo) + 1
        for job in todo:
            self._park(job, hold_queue, attempt=attempt)

    def _park(self, job: ArmadaJob, hold_queue: str, *, attempt: int | None = None) -> None:
        """A queued job held: submitted again into the hold queue, keeping its pointer."""
        self._submit_again(
            job,
            purpose="hold",
            queue=hold_queue,
            node_selector={},
            resume_from=job.spec.annotations.get(RESUME_FROM),
            attempt=attempt,
        )

    def _start_gang(self, gang: gangs.Gang, nodes: list[str] | None) -> None:
        """:meth:`start` for a gang: every member, as one. Left alone when a member has
        left the queue (Armada leases a gang whole)."""
        ended = [
            f"{job.job_id} ({job.phase.value})"
            for job in gang.members
            if job.terminal and not is_replaced(self._why_cancelled(job))
        ]
        if ended:
            raise ConnectorError(
                f"cannot start Armada gang {gang.external_id}: members {', '.join(ended)} "
                "have ended",
                retryable=False,
            )
        if any(job.active for job in gang.members):
            return
        self._settled(gang, "start")
        selectors = self._gang_pins(gang, nodes, "start") if nodes else {}
        targets = [node for name in nodes or [] if (node := self._declared(name))]
        resubmit = any(
            self._held(job)
            or {k: job.spec.node_selector.get(k) for k in selectors.get(job.workload_id, {})}
            != selectors.get(job.workload_id, {})
            for job in gang.members
        )
        fronts = [
            front
            for job in gang.members
            if (front := self._front(job, targets, resubmitted=resubmit)) is not None
        ]
        front = min(fronts) if fronts else None
        if resubmit:
            attempt = max(job.spec.attempt for job in gang.members) + 1
            for job in gang.members:
                self._submit_again(
                    job,
                    purpose=f"start:{','.join(nodes or [])}",
                    queue=self._home(job),
                    node_selector=selectors.get(job.workload_id, {}),
                    resume_from=job.spec.annotations.get(RESUME_FROM),
                    priority=front,
                    attempt=attempt,
                )
        elif front is not None:
            for job in gang.members:
                results = self.api.reprioritize(job.queue, job.job_set, [job.job_id], front)
                _refused(results, f"reprioritize job {job.job_id} to the front of its queue")

    def _front(
        self, job: ArmadaJob, nodes: list[ExecutorNode], *, resubmitted: bool
    ) -> float | None:
        """The priority that puts ``job`` ahead of the queued jobs of its (home) queue that
        Armada would run first and that could take one of ``nodes`` (any node: none
        given); None when none would. Armada's priority is a whole number, lower first;
        the job gets one less than the least of those (at least 0, where an earlier
        submission of the same priority still goes first). ``resubmitted``: the job is
        about to be submitted anew, so it is the latest of its priority."""
        home = self._home(job)
        ahead = []
        for other in current_attempts(self._jobs).values():
            if other.workload_id == job.workload_id or other.phase is not Phase.queued:
                continue
            if gangs.gang_id(job) is not None and gangs.gang_id(other) == gangs.gang_id(job):
                continue  # a member of the same gang goes with it
            if other.queue != home:
                continue
            if nodes and not self._could_take(other, nodes):
                continue
            if resubmitted:
                first = other.priority <= job.priority
            else:
                first = (other.priority, _stamp(other)) < (job.priority, _stamp(job))
            if first:
                ahead.append(other.priority)
        if not ahead:
            return None
        front = float(max(math.floor(min(ahead)) - 1, 0))
        return front if front < job.priority else None

    def _jobs_of(self, external_id: str) -> list[ArmadaJob]:
        """The job ``external_id`` names, or every member of the gang it names."""
        gang = self._gang(external_id)
        return list(gang.members) if gang is not None else [self._job(external_id)]

    def cancel(self, external_id: str) -> None:
        with self._lock:
            for job in self._jobs_of(external_id):
                if not job.terminal:
                    self.api.cancel(job.queue, job.job_set, job.job_id)

    def cancel_job_set(self, queue: str, job_set: str) -> None:
        """Armada's ``CancelJobSet``: every job of the job set that has not ended."""
        self.api.cancel_job_set(queue, job_set)

    def reprioritize(self, external_id: str, *, priority: float) -> None:
        """Armada's priority of one job, or of every member of a gang (lower runs first
        within its queue)."""
        with self._lock:
            for job in self._jobs_of(external_id):
                results = self.api.reprioritize(job.queue, job.job_set, [job.job_id], priority)
                _refused(results, f"reprioritize job {job.job_id}")

    def reprioritize_job_set(self, queue: str, job_set: str, *, priority: float) -> None:
        results = self.api.reprioritize(queue, job_set, None, priority)
        _refused(results, f"reprioritize job set {job_set} in queue {queue}")

    def preempt(self, external_id: str) -> None:
        """Armada's own preemption of a running job: it ends as preempted, with no
        checkpoint and nothing submitted again (the saga's requeue does that)."""
        with self._lock:
            for job in self._jobs_of(external_id):
                if job.active:
                    self.api.preempt(job.queue, job.job_set, job.job_id)

    def move_job_set(
        self, queue: str, job_set: str, *, executor: str, step_key: str | None = None
    ) -> dict[str, str]:
        """Move a queued job set to executor cluster ``executor``: every job is cancelled
        and submitted again with the node selector ``executor_label: executor`` (and no
        pin to one node). Refused (nothing changed) when a job has left the queue already,
        or when no declared node of that executor can run a job (its GPUs, its node
        selector). Workload id → new Armada job id.

        ``step_key``: the saga step's idempotency key (an operator's ``move_job_set``
        action). Each new job carries it (``shaper.io/stopped-by-step``) and gets a client
        id made of it and its workload, so a resend does not move the job set twice: jobs
        that carry the key are done (even if they have started since), the rest are moved,
        and a job cancelled to be submitted again whose next job is not in the events is
        submitted now under the step's client id (a delivery cut short between its cancel
        and its submit; Armada answers one it made before with that job), as a resent
        requeue does. Without a key such a job makes the call fail, retryably: moving the
        others would leave it behind."""
        with self._lock:
            self.catch_up()
            current = current_attempts(self._jobs)
            in_set = [
                job for job in current.values() if job.queue == queue and job.job_set == job_set
            ]
            done = {
                job.workload_id: job.job_id
                for job in in_set
                if step_key is not None and job.spec.annotations.get(STOPPED_BY_STEP) == step_key
            }
            cancelled = [
                (job, self._why_cancelled(job))
                for job in in_set
                if job.workload_id not in done and job.phase is Phase.cancelled
            ]
            # Cancelled by this step's cut-short delivery: submitted again below. Cancelled
            # by another change (a hold, a requeue) whose next job is not seen yet: moving
            # it too would make a second live job of that workload.
            ours = replaced_reason(step_key) if step_key is not None else None
            replaced = [job for job, why in cancelled if ours is not None and why == ours]
            others = [job for job, why in cancelled if is_replaced(why) and why != ours]
            if others:
                raise ConnectorError(
                    f"cannot move job set {job_set} yet: the next jobs of "
                    f"{', '.join(job.job_id for job in others)} (cancelled to be submitted "
                    "again) are not in its events yet",
                    retryable=True,
                )
            jobs = [
                job for job in in_set if not job.terminal and job.workload_id not in done
            ] + replaced
            if not jobs and done:
                logger.info("armada: move of job set %s: done by an earlier delivery", job_set)
                return done
            if not jobs:
                raise ConnectorError(
                    f"armada: job set {job_set} in queue {queue} has no queued jobs to move",
                    retryable=False,
                )
            started = [f"{job.job_id} ({job.phase.value})" for job in jobs if job.active]
            if started:
                raise ConnectorError(
                    f"cannot move job set {job_set}: only a queued job set moves, and "
                    f"{', '.join(started)} left the queue",
                    retryable=False,
                )
            targets = [node for node in self.config.nodes if node.executor == executor]
            if not targets:
                raise ConnectorError(
                    f"cannot move job set {job_set} to executor {executor}: no node of it is "
                    "declared (config nodes)",
                    retryable=False,
                )
            misfits = [
                f"{job.job_id}: {why}"
                for job in jobs
                if (why := self._misfit(job, targets)) is not None
            ]
            capacity = {node.name: node.gpu_count for node in targets}
            in_gangs = [
                gang
                for gang in gangs.gangs(current)[1].values()
                if gang.members[0].queue == queue and gang.members[0].job_set == job_set
            ]
            for gang in in_gangs:
                spread = gangs.spread(gang.members, capacity, list(capacity))
                if isinstance(spread, str):  # Armada runs a gang on one executor
                    misfits.append(f"gang {gang.gang_id}: {spread}")
            if misfits:
                raise ConnectorError(
                    f"cannot move job set {job_set} to executor {executor}: " + "; ".join(misfits),
                    retryable=False,
                )
            # A gang moves whole, its members under one fresh gang id (connectors.armada.gangs);
            # members an earlier delivery moved already have that attempt.
            attempts: dict[str, int] = {}
            for gang in in_gangs:
                # Members cancelled by another change were refused above: any left are
                # this step's, cut short, and go again now.
                self._settled(gang, f"move job set {job_set} with", resend=step_key is not None)
                left = [job for job in gang.members if job.workload_id not in done]
                if left:
                    attempt = max(job.spec.attempt for job in left) + 1
                    attempts.update(dict.fromkeys((j.workload_id for j in gang.members), attempt))
            moved = dict(done)
            for job in sorted(jobs, key=lambda j: j.job_id):
                moved[job.workload_id] = self._submit_again(
                    job,
                    purpose=f"move:{executor}",
                    queue=job.queue,
                    # A pin to one node (of the old executor) would keep it off them all.
                    node_selector={
                        self.config.executor_label: executor,
                        self.config.node_label: None,
                    },
                    resume_from=job.spec.annotations.get(RESUME_FROM),
                    step_key=step_key,
                    attempt=attempts.get(job.workload_id),
                    one_of_many=True,
                )
            return moved

    def _could_take(self, job: ArmadaJob, nodes: list[ExecutorNode]) -> bool:
        """Whether Armada could run ``job`` as it stands (its whole node selector) on one
        of ``nodes``."""
        selected = {node.name for node in self.config.selected_nodes(job.spec.node_selector)}
        return any(node.name in selected and node.gpu_count >= job.spec.gpus for node in nodes)

    def _misfit(self, job: ArmadaJob, nodes: list[ExecutorNode]) -> str | None:
        """Why no node of ``nodes`` can run ``job``; None when one can."""
        ignored = {self.config.executor_label, self.config.node_label}
        wanted = {k: v for k, v in job.spec.node_selector.items() if k not in ignored}
        selected = {node.name for node in self.config.selected_nodes(wanted)}
        if any(node.gpu_count >= job.spec.gpus and node.name in selected for node in nodes):
            return None
        needs = [f"{job.spec.gpus} GPUs"] + [f"{k}={v}" for k, v in sorted(wanted.items())]
        return f"needs {', '.join(needs)}, which no node there has"


def _stamp(job: ArmadaJob) -> float:
    return job.submitted_at.timestamp() if job.submitted_at is not None else 0.0


def _refused(results: dict[str, str], what: str) -> None:
    failed = {job_id: why for job_id, why in results.items() if why}
    if failed:
        raise ConnectorError(
            f"armada: {what}: "
            + "; ".join(f"{job_id}: {why}" for job_id, why in sorted(failed.items())),
            retryable=False,
        )


def create_armada_connector(**options: Any) -> ArmadaConnector:
    """``shaper connector run --kind armada --cluster C --set url=host:50051 --set
    job_sets='[{"queue": "q", "job_set": "s"}]' …``: the options are the config's fields."""
    return ArmadaConnector(ArmadaConnectorConfig(**options))
