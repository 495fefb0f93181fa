"""The connector's action worker: saga steps for the scheduler, on Celery queue connector.<cluster>.

The control plane (app/actions/saga.py) sends a scheduler-level step (a
``wire.steps.StepRequest``, one of ``ConnectorStep``) as the one keyword argument ``step``
of the task ``shaper.connector.<step>`` on queue ``connector.<cluster>`` and waits for a
:class:`StepReport` as the keyword argument ``report`` of ``step["reply_task"]`` on
``step["reply_queue"]``, sent with the connector's API token (scope
``connector:<cluster>``). Neither side imports the other; ``wire`` is the contract.

:class:`ConnectorStepExecutor` maps a step onto the connector's capability protocols:

* ``requeue`` → ``requeue(nodes=args["nodes"], exclude=args["exclude"])`` (either may be
  absent: no pin) with ``hold=True`` when ``args["hold"]``: a job stopped for another must
  not take its GPUs back before a plan starts it again;
* ``start`` → ``start(nodes=args["nodes"])`` where the connector can start a job on given
  nodes (``SupportsStart``), else ``resume`` for a suspended job and ``release`` for a held
  or pending one (the scheduler starts it when it fits, where it chooses);
* ``confirm`` → a read: the job runs on ``args["nodes"]`` (``expect: running``) or runs
  nowhere (``expect: stopped``); a resize's, on those nodes only (``exactly``) and, for a
  service shrunk off named nodes, with no more of its GPUs on each than
  ``args["gpus_at_most"]``; "not yet" is a retryable failure naming what was seen, so
  the control plane polls until it holds or gives up with the observed state. ``expect:
  accepted``: a job a move submitted here is one the scheduler runs
  (``SupportsArrivalCheck.check_arrival``, else connectors.arrival's rule over its report);
  a rejected one is a non-retryable failure, and the move is undone;
* ``reserve`` → ``reserve(gpus=args["gpus"], ttl_s=args["ttl_s"])``, ``unreserve`` →
  ``unreserve`` (``SupportsReservation``);
* ``resume`` → ``resume`` when the scheduler reports the job suspended, nothing when it
  runs, else ``release``: a job preempted by suspension comes back with ``resume``, one
  preempted by requeue (and held) by ``release``, and only a read tells them apart;
* ``resize`` → ``resize(replicas=)`` or, for schedulers that size jobs in nodes (Slurm),
  ``update_node_count(nodes=args["replicas"])``; an elastic training job's resize names
  its nodes (``args["nodes"]``) and goes to ``resize_job(nodes=, replicas=)``
  (``SupportsJobResize``); a service's shrink that names the replicas leaving each node
  (``args["leave"]``) goes to ``resize_off(replicas=, leave=)`` (``SupportsReplicaMoves``);
* ``hold``, ``release``, ``suspend``, ``cancel`` → the methods of those names; a move's
  hold (``args["pending"]``) reads the job back once held and fails (releasing it) when it
  is no longer pending: it started before the hold, and only a pending job moves; a
  compensation's release (``args["if_held"]``) releases only a job still pending and held
  (its reason says held, suspended or deactivated: each connector's word); a running job's
  move releases its copy at the target with ``args["resume_from"]``, handed over first to a
  connector that restarts work itself (``SupportsResumePointer``: Kubernetes writes it on
  the Job);
  a pending job's move cancels its home copy with ``args["moved_away"]``: through
  ``cancel_moved`` (``SupportsMovedCancel``: Slurm, sim), which fails the step when
  someone else ended or started the held job mid-move, so that the move is undone;
* ``submit`` → ``submit(spec, name=args["name"], nodes=args["nodes"], hold=args["hold"])``
  (``SupportsSubmit``), a federated move's arrival: ``args["spec"]`` is the ``SubmitSpec``
  the source cluster reported for the job ``workload_id`` (a job of the *source* cluster),
  and the result's ``external_id`` is the new job's id here. ``nodes`` (absent: no pin)
  pins it to those nodes here and ``hold`` (absent: false) submits it held: a running
  job's move, which must not start before its checkpoint image is staged on the node and
  is started by a ``release`` step; the result repeats ``nodes`` and ``held``. The
  connector is idempotent by name (a resent submit is not held or pinned again), the
  journal by key; its generation is fenced under
  ``moved-in:<args.source_cluster>/<workload_id>``, not under the bare id, which may name
  another job of this cluster.
* ``withdraw`` → ``withdraw(args["name"])`` (``SupportsSubmit``), a ``submit`` undone: the job
  that arrived as move ``args["name"]`` is cancelled; the result's ``external_id`` is its id,
  or null when none arrived or it has ended. Fenced under the same key as ``submit``, so a
  late submit of the superseded generation is refused, and submits nothing, after it.
* ``undo_resize`` → ``resize(replicas=args["back_to"])`` (as ``resize`` does it) only if
  this connector's journal holds a successful answer for the step ``args["undo_key"]``, a
  service's resize whose saga gave up on it or on its confirm; otherwise nothing is
  resized. The result's ``undone`` says which. It carries the compensation's new
  generation, so a copy of that resize still queued behind it is refused as stale.
* ``drain`` → ``drain_node(workload_id, reason=args["reason"])``, ``undrain`` →
  ``undrain_node(workload_id)`` (``SupportsDrain``): steps about a node, not a job — the
  step's ``workload_id`` is the node's name. The connector leaves a node already in that
  state as it is. Their ``confirm`` (``expect: drained``, ``expect: up``) reads the node
  back: ``draining`` (or ``down``: Ray lets an idle drained node go) or ``up``; "not yet"
  is retryable, as for a job. Fenced under ``node:<name>``, where the saga's generation is
  the action's id: a late step of an older drain or undrain of the node is refused once a
  newer one has been seen.
* ``move_job_set`` → ``move_job_set(args["queue"], args["job_set"],
  executor=args["executor"], step_key=key)`` (``SupportsJobSetMove``: Armada), an
  operator's move of a queued job set to another executor cluster; ``workload_id`` is
  ``job-set:<queue>/<job set>``, which its generation (the action's id) is fenced under.
  The step's key goes to the connector, so a resend whose answer was not journalled (a
  crash mid-step) moves no job twice; the result's ``moved`` maps workloads to new jobs.

Before a ``requeue`` or ``suspend``, a connector that restarts stopped work itself
(``SupportsResumePointer``: Kubernetes, Kueue) is handed the step's resume pointer:
``args["resume_from"]``, else the ``image_dir`` of ``args["image"]`` (the image the saga's
checkpoint step reported); other connectors need none (on Slurm the agent's ``stage``
step already placed the image where the restarted job finds it). A connector that stamps
what it stops (``SupportsStepKey``: Kubernetes, Kueue, Slurm) is handed the step's
idempotency key, so that a resent step does not stop the work again.

A step is refused (not run) when its name is unknown, it names no workload, the connector
lacks the capability, or its generation is older than one already seen for the workload
(the saga that sent it has been superseded). Answers are journalled by idempotency key in
``<state_dir>/steps.json`` (flock, atomic replace): a key answered before is answered again
with outcome ``duplicate`` without touching the scheduler. Failures that may pass on a
retry (a retryable :class:`ConnectorError`: scheduler down) are not journalled, so the
control plane's resend runs the step again.

The executor knows nothing of Celery; the connector runner serves its :meth:`handle` with
``wire.executor``, the same worker runtime node agents use.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from connectors.arrival import check_reported
from connectors.base import (
    ConnectorError,
    SupportsArrivalCheck,
    SupportsCancel,
    SupportsDrain,
    SupportsHold,
    SupportsJobResize,
    SupportsJobSetMove,
    SupportsMovedCancel,
    SupportsNodeCount,
    SupportsReplicaMoves,
    SupportsRequeue,
    SupportsReservation,
    SupportsResize,
    SupportsResumePointer,
    SupportsStart,
    SupportsStepKey,
    SupportsSubmit,
    SupportsSuspend,
)
from wire.queues import connector_queue
from wire.steps import ConnectorStep, Outcome, StepReport, StepRequest
from wire.telemetry import TERMINAL_JOB_STATES, JobReport, JobState, NodeState, SubmitSpec

log = logging.getLogger(__name__)

# The steps a connector runs (wire.steps.ConnectorStep), in the order they are listed.
KNOWN_STEPS = tuple(step.value for step in ConnectorStep)
# Answers kept; the oldest keys go first (their sagas finished long ago).
MAX_REMEMBERED_STEPS = 10_000


class _Refused(Exception):
    """The step cannot run here; nothing was done."""


# -- journal ----------------------------------------------------------------------------


class _Journal(BaseModel):
    # The highest generation seen per workload: older steps are refused.
    generations: dict[str, int] = Field(default_factory=dict)
    # Answers by idempotency key, oldest first.
    answers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # The key of the last resize that ran, per workload: what an undo_resize asks about,
    # kept apart from the answers, whose oldest are forgotten.
    resized: dict[str, str] = Field(default_factory=dict)

    def remember(self, key: str, report: dict[str, Any]) -> None:
        self.answers.pop(key, None)
        self.answers[key] = report
        while len(self.answers) > MAX_REMEMBERED_STEPS:
            del self.answers[next(iter(self.answers))]


class StepJournal:
    """``<state_dir>/steps.json``, read and written under ``steps.lock``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.state_dir / "steps.json"
        self._lock_path = self.state_dir / "steps.lock"

    def load(self) -> _Journal:
        try:
            return _Journal.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return _Journal()

    def save(self, journal: _Journal) -> None:
        temporary = self.path.with_suffix(".json.tmp")
        with open(temporary, "w") as stream:
            stream.write(journal.model_dump_json())
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, self.path)

    @contextmanager
    def hold(self) -> Iterator[_Journal]:
        """The journal, locked against other processes sharing this state directory."""
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self.load()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def answer(self, key: str) -> dict[str, Any] | None:
        with self.hold() as journal:
            return journal.answers.get(key)


# -- executor ---------------------------------------------------------------------------


class ConnectorStepExecutor:
    def __init__(self, connector: Any, *, cluster: str, state_dir: Path) -> None:
        """connector: any object with the capability protocols of connectors.base (and
        ``update_node_count`` for node-sized schedulers); only those a step needs are used."""
        self.connector = connector
        self.cluster = cluster
        self.name = connector_queue(cluster)
        self.journal = StepJournal(state_dir)
        self._steps: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
            ConnectorStep.start: self._start,
            ConnectorStep.confirm: self._confirm,
            ConnectorStep.reserve: self._reserve,
            ConnectorStep.unreserve: self._unreserve,
            ConnectorStep.resume: self._resume,
            ConnectorStep.requeue: self._requeue,
            ConnectorStep.resize: self._resize,
            ConnectorStep.hold: self._hold,
            ConnectorStep.release: self._release,
            ConnectorStep.suspend: self._suspend,
            ConnectorStep.cancel: self._cancel,
            ConnectorStep.submit: self._submit,
            ConnectorStep.withdraw: self._withdraw,
            ConnectorStep.drain: self._drain,
            ConnectorStep.undrain: self._undrain,
            ConnectorStep.move_job_set: self._move_job_set,
        }

    def handle(self, message: Mapping[str, Any]) -> StepReport | None:
        """Run a step as it came off the wire; ``None`` when it cannot even be answered."""
        try:
            request = StepRequest.model_validate(message)
        except ValidationError as error:
            try:
                action_id, key = int(message["action_id"]), str(message["key"])
            except (KeyError, TypeError, ValueError):
                # Neither the message nor the inputs pydantic quotes: a step's arguments
                # may carry a workload's environment.
                log.error(
                    "%s: unanswerable step message (keys %s): %s",
                    self.name,
                    sorted(message),
                    _what_is_wrong(error),
                )
                return None
            return StepReport(
                action_id=action_id,
                key=key,
                ok=False,
                outcome=Outcome.refused,
                error=f"malformed step message: {_what_is_wrong(error)}",
                executor=self.name,
            )
        return self.run(request)

    def run(self, request: StepRequest) -> StepReport:
        with self.journal.hold() as journal:
            remembered = journal.answers.get(request.key)
            if remembered is not None:
                report = StepReport.replayed(remembered)
                self._log(request, report)
                return report
            report, remember = self._execute(request, journal)
            if remember:
                journal.remember(request.key, report.model_dump(mode="json"))
            self.journal.save(journal)
        self._log(request, report)
        return report

    def _execute(self, request: StepRequest, journal: _Journal) -> tuple[StepReport, bool]:
        """The report, and whether a resend of the same key gets it again (not when a retry
        may go otherwise: a retryable scheduler error, or a bug in this connector)."""
        try:
            if request.step not in KNOWN_STEPS:
                known = ", ".join(KNOWN_STEPS)
                raise _Refused(f"unknown step {request.step!r} (this connector does {known})")
            if not request.workload_id:
                raise _Refused(f"step {request.step} names no workload")
            fence = _fence(request)
            seen = journal.generations.get(fence, 0)
            if request.generation < seen:
                raise _Refused(
                    f"stale generation {request.generation} for {fence}: "
                    f"this connector has seen generation {seen}"
                )
            # Written before the step runs, so a crash mid-step still fences older sagas.
            journal.generations[fence] = request.generation
            self.journal.save(journal)
            if request.step in (ConnectorStep.requeue, ConnectorStep.suspend):
                self._hand_over(request.workload_id, request.args, request.key)
            if (
                request.step == ConnectorStep.resize
                and request.args.get("nodes")
                and isinstance(self.connector, SupportsStepKey)
            ):
                # A training job's resize may restart it (a requeue): the key tells a
                # resend whether that happened already.
                self.connector.set_step_key(request.workload_id, request.key)
            if (
                request.step == ConnectorStep.release
                and request.args.get("resume_from")
                and isinstance(self.connector, SupportsResumePointer)
            ):
                # A running job's move, released at its target: where its pods resume from.
                self.connector.set_resume_pointer(
                    request.workload_id, _resume_pointer(request.args)
                )
            if request.step == ConnectorStep.undo_resize:
                result = self._undo_resize(request.workload_id, request.args, journal)
            elif request.step == ConnectorStep.cancel and request.args.get("moved_away"):
                result = self._cancel_moved(request.workload_id, request.key)
            elif request.step == ConnectorStep.move_job_set:
                result = self._move_job_set(request.workload_id, request.args, key=request.key)
            else:
                result = self._steps[request.step](request.workload_id, request.args)
                if request.step == ConnectorStep.resize:
                    journal.resized[request.workload_id] = request.key
        except _Refused as refusal:
            refused = self._report(request, ok=False, outcome=Outcome.refused, error=str(refusal))
            return refused, True
        except ConnectorError as error:
            failed = self._report(
                request, ok=False, error=f"{request.step}: {error}", retryable=error.retryable
            )
            return failed, not error.retryable
        except Exception as error:  # a bug here, not the scheduler's answer: say so, keep nothing
            log.exception("%s: %s of %s crashed", self.name, request.step, request.workload_id)
            crashed = self._report(
                request, ok=False, error=f"{request.step}: connector error: {error!r}"
            )
            return crashed, False
        return self._report(request, ok=True, result=result), True

    def _report(self, request: StepRequest, *, ok: bool, **fields: Any) -> StepReport:
        return request.answer(executor=self.name, ok=ok, **fields)

    def _log(self, request: StepRequest, report: StepReport) -> None:
        log.info(
            "%s %s of %s (action %s, generation %s): %s%s",
            self.name,
            request.step,
            request.workload_id,
            request.action_id,
            request.generation,
            report.outcome.value,
            "" if report.ok else f", failed: {report.error}",
        )

    # -- steps: each returns the report's result -------------------------------------------

    def _capable(self, protocol: type, step: str) -> Any:
        if not isinstance(self.connector, protocol):
            kind = getattr(self.connector, "kind", type(self.connector).__name__)
            raise _Refused(f"the {kind} connector cannot {step} jobs")
        return self.connector

    def _done(self, summary: str, workload_id: str, **fields: Any) -> dict[str, Any]:
        return {"summary": summary, "workload_id": workload_id, **fields}

    def _requeue(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        connector = self._capable(SupportsRequeue, "requeue")
        nodes, exclude = _names(args, "nodes"), _names(args, "exclude")
        hold = bool(args.get("hold"))
        resume_from = _resume_pointer(args)
        if hold:
            connector.requeue(workload_id, nodes=nodes, exclude=exclude, hold=True)
        else:
            connector.requeue(workload_id, nodes=nodes, exclude=exclude)
        where = "".join(
            [
                f" pinned to {','.join(nodes)}" if nodes else "",
                f" away from {','.join(exclude)}" if exclude else "",
                " and held until a plan starts it" if hold else "",
            ]
        )
        return self._done(
            f"requeued job {workload_id}{where}",
            workload_id,
            nodes=nodes,
            exclude=exclude,
            held=hold,
            **({"resume_from": resume_from} if resume_from else {}),
        )

    def _hand_over(self, workload_id: str, args: dict[str, Any], key: str) -> None:
        """A requeue's or suspend's resume pointer and idempotency key, given to a connector
        that restarts the work itself, before the step runs."""
        if isinstance(self.connector, SupportsResumePointer):
            # Handed over on every requeue and suspend, None included: a pointer an earlier,
            # abandoned step left behind must not make this one resume from an old image.
            self.connector.set_resume_pointer(workload_id, _resume_pointer(args))
        if isinstance(self.connector, SupportsStepKey):
            self.connector.set_step_key(workload_id, key)

    def _start(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        nodes = _names(args, "nodes")
        replicas = args.get("replicas")
        if (
            isinstance(replicas, int)
            and replicas > 0
            and isinstance(self.connector, SupportsJobResize)
        ):
            # An elastic training job: started at the size the plan gives it.
            self.connector.start(workload_id, nodes=nodes, replicas=replicas, gpus=_gpus(args))
            where = f" on {','.join(nodes)}" if nodes else ""
            return self._done(
                f"asked the scheduler to start job {workload_id}{where} at {replicas} replicas",
                workload_id,
            )
        if isinstance(self.connector, SupportsStart):
            self.connector.start(workload_id, nodes=nodes)
            where = f" on {','.join(nodes)}" if nodes else ""
            return self._done(f"asked the scheduler to start job {workload_id}{where}", workload_id)
        if self._job_state(workload_id) is JobState.suspended:
            self._capable(SupportsSuspend, "start").resume(workload_id)
            return self._done(f"resumed suspended job {workload_id}", workload_id)
        self._capable(SupportsHold, "start").release(workload_id)
        return self._done(f"released job {workload_id} to start", workload_id)

    def _confirm(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        expect = args.get("expect")
        if expect == "accepted":
            return self._confirm_arrival(workload_id)
        if expect in NODE_EXPECTATIONS:
            return self._confirm_node(workload_id, expect)
        if expect not in ("running", "stopped"):
            raise _Refused(
                "confirm needs args.expect 'running', 'stopped', 'accepted', 'drained' or "
                f"'up', got {expect!r}"
            )
        job = self._job(workload_id)
        if job is None:
            raise ConnectorError(f"the scheduler does not report job {workload_id}", retryable=True)
        where = sorted({a.node for a in job.allocations})
        seen = f"job {workload_id} is {job.state.value}" + (
            f" on {','.join(where)}" if where else ""
        )
        if job.reason:
            seen += f" ({job.reason})"
        wanted = _names(args, "nodes") or []
        if expect == "running":
            ok = job.state is JobState.running and set(wanted) <= set(where)
            goal = f"running on {','.join(wanted)}" if wanted else "running"
            if args.get("exactly"):
                # A resized job: on those nodes and no others — or, where the plan put more
                # than one replica on a node and the scheduler runs one per node (Slurm),
                # on no more nodes than it has replicas.
                replicas = args.get("replicas")
                most = max(len(wanted), replicas if isinstance(replicas, int) else 0)
                ok = ok and len(where) <= most  # with ``wanted`` among them
                goal += " only" if most == len(wanted) else f" and at most {most} nodes"
            at_most = _gpus_at_most(args)
            if at_most:
                # A service shrunk off named nodes (args.leave): its GPUs there as the plan
                # leaves them, or fewer (replicas being deleted still hold theirs).
                held: dict[str, int] = {}
                for allocation in job.allocations:
                    held[allocation.node] = held.get(allocation.node, 0) + allocation.gpus
                ok = ok and all(held.get(node, 0) <= cap for node, cap in at_most.items())
                goal += ", with at most " + ", ".join(
                    f"{cap} GPU(s) on {node}" for node, cap in sorted(at_most.items())
                )
                seen += (
                    " (GPUs "
                    + ", ".join(f"{node}: {held.get(node, 0)}" for node in sorted(at_most))
                    + ")"
                )
        else:
            ok = job.state is not JobState.running
            goal = "stopped"
        if not ok:
            raise ConnectorError(f"{seen}; expected {goal}", retryable=True)
        return self._done(seen, workload_id, state=job.state.value, nodes=where)

    def _confirm_arrival(self, workload_id: str) -> dict[str, Any]:
        """A pending job's move, its copy here checked before its home copy is cancelled
        (connectors.arrival): by the connector when it knows more than its report says."""
        if isinstance(self.connector, SupportsArrivalCheck):
            # Reads the one job (Slurm: squeue -j; Kubernetes: the Job and its pods), where
            # the fallback below reads the whole cluster on every poll of the confirm.
            seen = self.connector.check_arrival(workload_id)
        else:
            seen = check_reported(self._job(workload_id), workload_id)
        return self._done(seen, workload_id, accepted=True)

    def _confirm_node(self, node: str, expect: str) -> dict[str, Any]:
        """A drain's or undrain's confirm: the scheduler reports the node in the state asked
        for (a drained node may have left: Ray lets an idle one go, so ``down`` counts)."""
        read_state = getattr(self.connector, "read_state", None)
        if read_state is None:
            raise _Refused(f"the {self.cluster} connector cannot read its scheduler")
        report = next((n for n in read_state().nodes if n.name == node), None)
        if report is None:
            raise ConnectorError(f"the scheduler does not report node {node}", retryable=True)
        seen = f"node {node} is {report.state.value}"
        if report.state not in NODE_EXPECTATIONS[expect]:
            raise ConnectorError(f"{seen}; expected {expect}", retryable=True)
        return self._done(seen, node, node=node, state=report.state.value)

    def _drainer(self, step: str) -> Any:
        if not isinstance(self.connector, SupportsDrain):
            kind = getattr(self.connector, "kind", type(self.connector).__name__)
            raise _Refused(f"the {kind} connector cannot {step} nodes")
        return self.connector

    def _drain(self, node: str, args: dict[str, Any]) -> dict[str, Any]:
        reason = args.get("reason") or "drained by Shaper"
        if not isinstance(reason, str):
            raise _Refused(f"drain's args.reason must be a string, got {reason!r}")
        self._drainer("drain").drain_node(node, reason=reason)
        return self._done(f"drained node {node} ({reason})", node, node=node, reason=reason)

    def _undrain(self, node: str, args: dict[str, Any]) -> dict[str, Any]:
        self._drainer("undrain").undrain_node(node)
        return self._done(f"gave node {node} back to the scheduler", node, node=node)

    def _reserve(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        gpus = args.get("gpus")
        if not isinstance(gpus, dict) or not all(
            isinstance(n, str) and isinstance(g, int) and g > 0 for n, g in gpus.items()
        ):
            raise _Refused(f"reserve needs args.gpus as {{node: GPUs > 0}}, got {gpus!r}")
        ttl_s = float(args.get("ttl_s") or 900.0)
        counts_on = _names(args, "counts_on")
        self._capable(SupportsReservation, "reserve GPUs for").reserve(
            workload_id, gpus=gpus, ttl_s=ttl_s, counts_on=counts_on
        )
        where = ", ".join(f"{n}:{g}" for n, g in sorted(gpus.items()))
        return self._done(f"holding {where} for job {workload_id}", workload_id, gpus=gpus)

    def _unreserve(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        self._capable(SupportsReservation, "reserve GPUs for").unreserve(workload_id)
        return self._done(f"released the GPUs held for job {workload_id}", workload_id)

    def _resume(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        state = self._job_state(workload_id)
        if state is JobState.suspended:
            self._capable(SupportsSuspend, "resume").resume(workload_id)
            return self._done(f"resumed suspended job {workload_id}", workload_id)
        if state is JobState.running:
            return self._done(f"job {workload_id} already runs", workload_id)
        self._capable(SupportsHold, "resume").release(workload_id)
        return self._done(f"released job {workload_id} to run again", workload_id)

    def _job_state(self, workload_id: str) -> JobState | None:
        """The job's state as the scheduler reports it now; None when unknown."""
        if getattr(self.connector, "read_state", None) is None:
            return None
        job = self._job(workload_id)
        return job.state if job is not None else None

    def _job(self, workload_id: str) -> JobReport | None:
        """The job as the scheduler reports it now; None when unknown."""
        read_state = getattr(self.connector, "read_state", None)
        if read_state is None:
            raise _Refused(f"the {self.cluster} connector cannot read its scheduler")
        jobs = read_state().jobs
        return next((job for job in jobs if job.external_id == workload_id), None)

    def _resize(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        replicas = args.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise _Refused(f"resize needs args.replicas >= 1, got {replicas!r}")
        nodes = _names(args, "nodes")
        if nodes is not None:  # an elastic training job: its size and where it runs
            if not nodes:
                raise _Refused("an elastic training job's resize needs args.nodes")
            self._capable(SupportsJobResize, "resize a training job").resize_job(
                workload_id, nodes=nodes, replicas=replicas, gpus=_gpus(args)
            )
            return self._done(
                f"resized job {workload_id} to {replicas} on {','.join(nodes)}",
                workload_id,
                replicas=replicas,
                nodes=nodes,
            )
        leave = _leave(args)
        if leave:  # a service shrinking off named nodes (its replicas move)
            self._capable(SupportsReplicaMoves, "move a service's replicas").resize_off(
                workload_id, replicas=replicas, leave=leave
            )
            return self._done(
                f"resized job {workload_id} to {replicas}, its replicas off "
                + ",".join(f"{node} ({count})" for node, count in sorted(leave.items())),
                workload_id,
                replicas=replicas,
                leave=leave,
            )
        if isinstance(self.connector, SupportsResize):
            self.connector.resize(workload_id, replicas=replicas)
        else:
            self._capable(SupportsNodeCount, "resize").update_node_count(
                workload_id, nodes=replicas
            )
        return self._done(
            f"resized job {workload_id} to {replicas}", workload_id, replicas=replicas
        )

    def _undo_resize(
        self, workload_id: str, args: dict[str, Any], journal: _Journal
    ) -> dict[str, Any]:
        """A failed saga's resize undone: back to ``args.back_to`` replicas if the last resize
        of the workload this connector ran is ``args.undo_key`` (a journal from before it
        kept that: a successful answer for the key), else nothing (never ran here, or a
        newer resize has run since, whose size stands).
        Either way the step's new generation, recorded before it runs, fences off any copy
        of that resize still on its way here."""
        undo_key = args.get("undo_key")
        if not isinstance(undo_key, str) or not undo_key:
            raise _Refused("undo_resize needs args.undo_key, the resize step's key")
        back_to = args.get("back_to")
        if not isinstance(back_to, int) or isinstance(back_to, bool) or back_to < 1:
            raise _Refused(f"undo_resize needs args.back_to >= 1, got {back_to!r}")
        last = journal.resized.get(workload_id)
        if last is not None:
            ran = last == undo_key  # a newer resize of it since: not this one's to undo
        else:  # a journal from before it kept the last resize: its answers then
            answer = journal.answers.get(undo_key)
            ran = bool(answer and answer.get("ok"))
        if not ran:
            return {
                "summary": f"resize {undo_key} of {workload_id} never ran here: nothing to undo",
                "undone": False,
            }
        done = self._resize(workload_id, {"replicas": back_to})
        return {**done, "undone": True}

    def _hold(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        connector = self._capable(SupportsHold, "hold")
        if args.get("pending"):
            # A move's hold of a job that runs already is refused before the hold: on
            # Kubernetes a hold suspends the Job (its pods go) and on Kueue it evicts the
            # Workload, so holding first would throw away the work the move must leave
            # alone. (The read after the hold catches a job that starts in between.)
            before = self._job_state(workload_id)
            if before in (JobState.running, JobState.suspended):
                raise ConnectorError(
                    f"job {workload_id} is {before.value}: only a pending job is held for a "
                    "move (nothing was held)",
                    retryable=False,
                )
        connector.hold(workload_id)
        if args.get("pending"):
            # A move's hold: held, the job can no longer start, so one read tells whether it
            # started before the hold took effect; such a job is not the move's to take.
            state = self._job_state(workload_id)
            if state is not JobState.pending:
                if state not in TERMINAL_JOB_STATES:  # running, suspended or not reported
                    try:
                        connector.release(workload_id)  # leave it as it was
                    except ConnectorError as error:
                        log.warning("%s: release after a refused hold: %s", self.name, error)
                seen = state.value if state is not None else "not reported"
                raise ConnectorError(
                    f"job {workload_id} is {seen}: only a pending job is held for a move "
                    "(the hold was released)",
                    retryable=False,
                )
        return self._done(f"held job {workload_id}", workload_id)

    def _release(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        connector = self._capable(SupportsHold, "release")
        if args.get("if_held"):
            # A compensation's: the hold it undoes may never have taken effect.
            job = self._job(workload_id)
            held = job is not None and job.state is JobState.pending and _held(job.reason)
            if not held:
                seen = "not reported" if job is None else f"{job.state.value}, {job.reason!r}"
                return self._done(
                    f"job {workload_id} is not held ({seen}): nothing to release", workload_id
                )
        connector.release(workload_id)
        return self._done(f"released job {workload_id}", workload_id)

    def _suspend(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        connector = self._capable(SupportsSuspend, "suspend")
        resume_from = _resume_pointer(args)
        connector.suspend(workload_id)
        return self._done(
            f"suspended job {workload_id}",
            workload_id,
            **({"resume_from": resume_from} if resume_from else {}),
        )

    def _cancel(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        self._capable(SupportsCancel, "cancel").cancel(workload_id)
        return self._done(f"cancelled job {workload_id}", workload_id)

    def _cancel_moved(self, workload_id: str, key: str) -> dict[str, Any]:
        """A pending job's move, its home copy cancelled once the target has its own: a
        connector that can tell its own cancel from someone else's (SupportsMovedCancel)
        fails the step when someone else ended the job mid-move, so the saga undoes the move;
        others cancel, and a job a user cancelled meanwhile still runs at the target."""
        if isinstance(self.connector, SupportsMovedCancel):
            self.connector.cancel_moved(workload_id, key=key)
            return self._done(f"cancelled job {workload_id}, moved away", workload_id)
        return self._cancel(workload_id, {})

    def _submit(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """Submit the job ``workload_id`` of another cluster here, from its spec, as
        ``args.name`` — pinned to ``args.nodes`` and held when ``args.hold`` (a running
        job's move: a ``release`` starts it once its image is staged); the result's
        ``external_id`` is the new job's id here, ``held`` and ``nodes`` what was asked."""
        name = args.get("name")
        if not isinstance(name, str) or not name:
            raise _Refused(f"submit needs args.name (the move's job name), got {name!r}")
        raw_spec = args.get("spec")
        if not isinstance(raw_spec, dict):
            raise _Refused(f"submit needs args.spec (a SubmitSpec as JSON), got {raw_spec!r}")
        try:
            spec = SubmitSpec.model_validate(raw_spec)
        except ValidationError as error:
            raise _Refused(f"args.spec is not a SubmitSpec: {error}") from None
        nodes = _names(args, "nodes") or None
        hold = args.get("hold")
        if hold is None:
            hold = False
        if not isinstance(hold, bool):
            raise _Refused(f"submit's args.hold must be true or false, got {hold!r}")
        connector = self._capable(SupportsSubmit, "submit")
        external_id = connector.submit(spec, name=name, nodes=nodes, hold=hold)
        how = "".join([f", pinned to {','.join(nodes)}" if nodes else "", ", held" if hold else ""])
        return self._done(
            f"submitted job {workload_id} of another cluster here as job {external_id} "
            f"({name}{how})",
            workload_id,
            external_id=external_id,
            name=name,
            held=hold,
            nodes=nodes or [],
        )

    def _move_job_set(
        self, subject: str, args: dict[str, Any], key: str | None = None
    ) -> dict[str, Any]:
        fields = {name: args.get(name) for name in ("queue", "job_set", "executor")}
        for name, value in fields.items():
            if not isinstance(value, str) or not value:
                raise _Refused(
                    f"move_job_set needs args.{name} (a non-empty string), got {value!r}"
                )
        queue, job_set, executor = (str(v) for v in fields.values())
        if not isinstance(self.connector, SupportsJobSetMove):
            kind = getattr(self.connector, "kind", type(self.connector).__name__)
            raise _Refused(f"the {kind} connector cannot move job sets (Armada's alone)")
        moved = self.connector.move_job_set(queue, job_set, executor=executor, step_key=key)
        return self._done(
            f"moved job set {job_set} of queue {queue} to executor {executor} "
            f"({len(moved)} jobs submitted again there)",
            subject,
            executor=executor,
            moved=moved,
        )

    def _withdraw(self, workload_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """Undo a ``submit`` of the job ``workload_id`` of another cluster: cancel the job
        that arrived here as ``args.name``; the result's ``external_id`` is its id, or None
        when no such job arrived (or it has ended already)."""
        name = args.get("name")
        if not isinstance(name, str) or not name:
            raise _Refused(f"withdraw needs args.name (the move's job name), got {name!r}")
        connector = self._capable(SupportsSubmit, "withdraw")
        external_id = connector.withdraw(name)
        summary = (
            f"withdrew job {external_id} ({name}), submitted here for job {workload_id} "
            "of another cluster"
            if external_id is not None
            else f"nothing to withdraw: no job of move {name} waits or runs here"
        )
        return self._done(summary, workload_id, external_id=external_id, name=name)


# A node step's confirm: the node states that satisfy each ``args.expect``.
NODE_EXPECTATIONS: dict[str, frozenset[NodeState]] = {
    "drained": frozenset({NodeState.draining, NodeState.down}),
    "up": frozenset({NodeState.up}),
}

# Words of a pending job's reason that say a hold keeps it (each connector's own): Slurm's
# JobHeldUser/JobHeldAdmin, a suspended Kubernetes Job (Kubernetes' hold), a deactivated
# Kueue Workload (Kueue's hold).
HELD_REASONS = ("held", "suspended", "deactivated")


def _held(reason: str | None) -> bool:
    text = (reason or "").lower()
    return any(word in text for word in HELD_REASONS)


def _fence(request: StepRequest) -> str:
    """The key a step's generation is fenced under: the workload it is about.

    A ``submit`` names the job on the *source* cluster, whose id may equal one of this
    cluster's own jobs (Slurm ids are small counters everywhere); fenced under that bare id
    it would refuse, or be refused by, the sagas of this cluster's job of the same id. So a
    submit is fenced under ``moved-in:<source cluster>/<id>`` (``moved-in:<id>`` when the
    step does not say where the job comes from): a superseded move's submit is still
    refused, and this cluster's own jobs are not touched. A ``withdraw`` is fenced under
    the same key: once a newer saga has withdrawn the job, a late submit of an older one
    is refused instead of submitting it again."""
    workload_id = request.workload_id or ""
    if request.step in (ConnectorStep.drain, ConnectorStep.undrain) or (
        request.step == ConnectorStep.confirm and request.args.get("expect") in NODE_EXPECTATIONS
    ):
        return f"node:{workload_id}"  # a node's name, which may equal a job's id
    if request.step not in (ConnectorStep.submit, ConnectorStep.withdraw):
        return workload_id
    source = request.args.get("source_cluster")
    return (
        f"moved-in:{source}/{workload_id}"
        if isinstance(source, str) and source
        else (f"moved-in:{workload_id}")
    )


def _gpus(args: dict[str, Any]) -> dict[str, int] | None:
    """``args.gpus``: the plan's GPUs per node ({node: GPUs > 0}), or None."""
    return _per_node(args, "gpus", "GPUs", least=1)


def _leave(args: dict[str, Any]) -> dict[str, int] | None:
    """``args.leave``: a service's replicas to take off each node ({node: replicas > 0})."""
    return _per_node(args, "leave", "replicas", least=1)


def _gpus_at_most(args: dict[str, Any]) -> dict[str, int] | None:
    """``args.gpus_at_most`` of a resize's confirm: {node: GPUs >= 0}."""
    return _per_node(args, "gpus_at_most", "GPUs", least=0)


def _per_node(args: dict[str, Any], field: str, unit: str, *, least: int) -> dict[str, int] | None:
    """``args[field]``, a count per node ({node: count >= least}), or None; refused when
    malformed."""
    value = args.get(field)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(node, str)
        and node
        and isinstance(count, int)
        and not isinstance(count, bool)
        and count >= least
        for node, count in value.items()
    ):
        bound = f"> {least - 1}" if least > 0 else f">= {least}"
        raise _Refused(f"args.{field} must be {{node: {unit} {bound}}}, got {value!r}")
    return value


def _names(args: dict[str, Any], field: str) -> list[str] | None:
    value = args.get(field)
    if value is None:
        return None
    if isinstance(value, str):
        value = [name for name in value.split(",") if name]
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _Refused(f"args.{field} must be a list of node names, got {value!r}")
    return value


def _resume_pointer(args: dict[str, Any]) -> str | None:
    """Where the stopped work resumes from: ``args.resume_from``, else the directory of the
    checkpoint image that the saga's checkpoint step reported (``args.image``)."""
    pointer = args.get("resume_from")
    if pointer is None and isinstance(args.get("image"), dict):
        pointer = args["image"].get("image_dir")
    if pointer is None:
        return None
    if not isinstance(pointer, str) or not pointer:
        raise _Refused(f"args.resume_from must be a non-empty string, got {pointer!r}")
    return pointer


def _what_is_wrong(error: ValidationError) -> str:
    """Each field at fault and why, without the value it had (``str(error)`` quotes the
    input, which may be a workload's environment)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'message'}: {item['msg']}"
        for item in error.errors(include_input=False)
    )
