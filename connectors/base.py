"""What a connector is: a tiny required protocol plus optional capability protocols.

:class:`Connector` reads the scheduler's current state (a ``wire.telemetry.ClusterState``);
the ``Supports*`` protocols are the scheduler-level actions a connector may offer, which
connectors.actions maps saga steps onto. A connector returns wire types, never SDK objects,
and raises :class:`ConnectorError` (with ``retryable``) when its scheduler cannot be read or
changed. What crosses the wire (telemetry schemas, the step protocol, queue names) is in
``wire``, shared with the control plane and the node agents.
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

from wire.telemetry import ClusterState, SchedulerKind, SubmitSpec


@runtime_checkable
class Connector(Protocol):
    """The one required capability: read the scheduler's current state."""

    kind: SchedulerKind
    cluster: str

    def read_state(self) -> ClusterState: ...


@runtime_checkable
class SupportsRequeue(Protocol):
    """``hold=True``: the job stays held in the queue until released (a plan's start)."""

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None: ...


@runtime_checkable
class SupportsHold(Protocol):
    def hold(self, external_id: str) -> None: ...
    def release(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsSuspend(Protocol):
    def suspend(self, external_id: str) -> None: ...
    def resume(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsCancel(Protocol):
    def cancel(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsMovedCancel(Protocol):
    """Cancel a job's home copy at the end of a pending job's move (the target has its own
    copy now), telling apart a job that an earlier delivery of this step cancelled from one
    that someone else ended first — a user who cancelled the held job mid-move must not see
    it run at the target.

    ``cancel_moved(external_id, key=step key)``: a pending job is stamped with the key
    where the scheduler keeps it across the cancel (Slurm: the AdminComment users cannot
    set) and then cancelled; a job that ended and carries the stamp was this step's, so
    nothing is done; a job that ended without it, or that is running (its hold lifted by
    someone else), raises a non-retryable ConnectorError saying so, and the saga undoes
    the move (withdraws the target's copy). A job the scheduler no longer knows cannot be
    told apart: the move stands (logged), for failing it would withdraw the only copy."""

    def cancel_moved(self, external_id: str, *, key: str) -> None: ...


@runtime_checkable
class SupportsResize(Protocol):
    def resize(self, external_id: str, *, replicas: int) -> None: ...


@runtime_checkable
class SupportsReplicaMoves(Protocol):
    """Shrink an elastic service to ``replicas`` taking ``leave[node]`` replicas off each
    named node (the ``resize`` step of a service whose plan frees GPUs on those nodes for
    other work: the replicas it moves come back where there is room once that work has
    them, app/shaping/cycle.py). Only the named nodes' replicas go; returns once the
    scheduler is deleting them (they may still be stopping: the confirm step that follows
    reads when their GPUs are free, and the work waiting on those GPUs starts after). The
    control plane sends it only with a shrink (``replicas`` below the service's size; a
    move that keeps the size is a shrink, then a growth back: app/shaping/cycle.py), so a
    service already at ``replicas`` is a resent step, left as it is. A service whose
    scheduler would choose other replicas (a StatefulSet drops its highest ordinals), or
    a node that holds fewer of its replicas than ``leave`` says, raises a non-retryable
    ConnectorError saying so."""

    def resize_off(self, external_id: str, *, replicas: int, leave: dict[str, int]) -> None: ...


@runtime_checkable
class SupportsReservation(Protocol):
    """Hold GPUs for one job: as they come free, the scheduler gives them to nobody else.

    ``reserve`` replaces the job's earlier reservation; it lapses after ``ttl_s``, when the
    job starts on those nodes (consumed) or on ``unreserve``. Idempotent. ``counts_on``:
    the jobs whose GPUs there the plan frees for it (the job itself included); when the
    GPUs cannot come free because other jobs hold them, it raises a non-retryable
    ConnectorError naming them — the plan was made on a view that is out of date.
    """

    def reserve(
        self,
        external_id: str,
        *,
        gpus: dict[str, int],
        ttl_s: float,
        counts_on: list[str] | None = None,
    ) -> None: ...
    def unreserve(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsUpkeep(Protocol):
    """Periodic housekeeping of what the connector itself holds in its scheduler (Slurm:
    reservations whose job now runs or has gone). The connector deployment calls it every
    few seconds; it returns one line per thing it tidied, for the log."""

    def upkeep(self) -> list[str]: ...


@runtime_checkable
class SupportsStart(Protocol):
    """Start a pending, held or suspended job now, on ``nodes`` when given (a plan's)."""

    def start(self, external_id: str, *, nodes: list[str] | None = None) -> None: ...


@runtime_checkable
class SupportsResumePointer(Protocol):
    """Connectors whose scheduler restarts a stopped job itself (Kubernetes recreates its
    pods, Kueue re-admits its Workload) and so must tell the new pods where to resume.

    The saga's checkpoint step (the node agent's) says where the checkpoint is; the
    executor hands that pointer over with ``set_resume_pointer`` just before the
    ``requeue`` or ``suspend`` of the same step, which gives it to the pods it restarts;
    ``None`` (a step without a checkpoint) clears what an earlier step left. The connector
    keeps it only until that call: the durable copies are the ones the action writes into
    the scheduler's objects, and a resent step hands it over again."""

    def set_resume_pointer(self, external_id: str, resume_from: str | None) -> None: ...


@runtime_checkable
class SupportsStepKey(Protocol):
    """Connectors that stamp the work they stop with the step that stopped it.

    The executor hands a ``requeue``'s or ``suspend``'s idempotency key over with
    ``set_step_key`` just before the step, as it does the resume pointer. The connector
    writes it on the object it stops in the same change that stops it (Kubernetes: an
    annotation on the Job or Workload; Slurm: the job's AdminComment), so that a resend
    of a step that already stopped and restarted the work — the connector died before its
    answer was journalled, or the answer was lost — finds its own stamp and finishes what
    is left instead of stopping the work a second time (and losing what it did since)."""

    def set_step_key(self, external_id: str, step_key: str) -> None: ...


# What a federated move's name may be (app.actions.messages.move_name makes them so): one
# word of a Slurm comment and an squeue column, a Kubernetes annotation value, a Ray
# submission id once its '/' and ':' are replaced.
MOVE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,127}$")


def check_move_name(name: str, *, step: str = "submit") -> str:
    """``name`` when it is a move's name, else a non-retryable ConnectorError saying why."""
    if not isinstance(name, str) or not MOVE_NAME.match(name):
        raise ConnectorError(
            f"{step}: the move name {name!r} must be 1-128 characters of letters, digits "
            "and ._:@+/-",
            retryable=False,
        )
    return name


@runtime_checkable
class SupportsSubmit(Protocol):
    """Submit a job from a ``SubmitSpec`` read in another cluster (a federated move), as
    ``name``; return its external id here. ``nodes`` pins it to those nodes of this cluster
    (over any placement the spec names); ``hold`` submits it held, so that it waits for a
    ``release`` (a running job's move: it must not start before its checkpoint image is
    staged on the pinned node). Idempotent by name: when a job of that name exists already
    (a resent step), return its id and submit nothing — it is not held or pinned again. A
    spec this scheduler cannot run raises a non-retryable ConnectorError saying why.
    ``withdraw`` undoes a submit by the same name (a move compensated, or one whose answer
    was lost)."""

    def submit(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str: ...

    def withdraw(self, name: str) -> str | None:
        """Cancel the job submitted here as move ``name``; its id, or None when no job of
        that name ever arrived (or it has ended). Idempotent: a second call cancels nothing."""
        ...


@runtime_checkable
class SupportsArrivalCheck(Protocol):
    """Say whether a job that a move submitted here (``SupportsSubmit``) is one this
    scheduler will run, before the move cancels the job's home copy: a scheduler may accept
    the submission and only later find it cannot run it (connectors.arrival says what each
    family's "accepted" is and why).

    ``check_arrival(external_id)``: what was seen, once the scheduler holds the job in a
    state it runs from (queued past its admission checks, running, or having run); a
    retryable ConnectorError while that cannot be told yet (the saga asks again, then gives
    up and undoes the move); a non-retryable one when the scheduler rejected it (it ended
    without ever running, or waits in a state no wait fixes), and the move is undone."""

    def check_arrival(self, external_id: str) -> str: ...


@runtime_checkable
class SupportsNodeCount(Protocol):
    """Change how many nodes a job gets (Slurm: pending jobs; running ones only shrink)."""

    def update_node_count(self, external_id: str, *, nodes: int) -> None: ...


@runtime_checkable
class SupportsJobResize(Protocol):
    """Run an elastic training job (wire.telemetry.JobReport with ``max_replicas``) on
    ``replicas`` replicas on ``nodes`` (the ``resize`` step of a block job's resize).

    A running job that only gives nodes back shrinks where it runs, if the scheduler can
    (Slurm: ``NodeList``; the job's own elastic runtime carries on with fewer); one that
    grows or goes elsewhere is restarted there at the new size and resumes from its own
    checkpoint. Idempotent: a job already running on ``nodes`` is left as it is. A plan the
    scheduler cannot carry out raises a non-retryable ConnectorError.

    ``start`` takes the size too (``replicas``): a pending elastic training job starts on
    ``nodes`` at the size the plan gives it, not at whatever of its range the scheduler
    finds. ``gpus``: the plan's GPUs per node, for a scheduler that places replicas by the
    GPU (the simulated cluster); one that runs a replica per node (Slurm) needs only the
    nodes."""

    def resize_job(
        self,
        external_id: str,
        *,
        nodes: list[str],
        replicas: int,
        gpus: dict[str, int] | None = None,
    ) -> None: ...

    def start(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        replicas: int | None = None,
        gpus: dict[str, int] | None = None,
    ) -> None: ...


@runtime_checkable
class SupportsDrain(Protocol):
    """Take a node out of the scheduler's placement, and give it back (an operator's drain:
    ``POST /clusters/{cluster}/nodes/{node}/drain``, run as the ``drain`` step).

    ``drain_node(node, reason=…)``: the scheduler places no new work on ``node`` (Shaper's
    name for it, as telemetry reports it); what runs there goes on. Idempotent: a node
    already draining or drained succeeds untouched. ``undrain_node(node)``: the scheduler
    may place work there again; idempotent too. A scheduler that cannot undrain (Ray) raises
    a non-retryable ConnectorError saying so. An unknown node is a non-retryable
    ConnectorError; telemetry reports a draining node as ``NodeState.draining``."""

    def drain_node(self, node: str, *, reason: str) -> None: ...
    def undrain_node(self, node: str) -> None: ...


@runtime_checkable
class SupportsJobSetMove(Protocol):
    """Move a queued job set to another executor cluster of the scheduler (Armada's: an
    operator's ``move_job_set`` action). Workload id → its new job id. ``step_key``: the
    step's idempotency key, so that a resend after a lost answer moves no job twice. A job
    set that has started, or that the target cannot run, is a non-retryable
    ConnectorError saying why (nothing moved)."""

    def move_job_set(
        self, queue: str, job_set: str, *, executor: str, step_key: str | None = None
    ) -> dict[str, str]: ...


@runtime_checkable
class SupportsChangeWait(Protocol):
    """Connectors that learn of changes as they happen (a Kubernetes watch): the runner
    waits on this between pushes instead of sleeping its whole interval, so a change reaches
    the control plane at once. True when something changed since the previous call (which
    the call consumes), False after ``timeout_s`` without a change."""

    def wait_for_change(self, timeout_s: float) -> bool: ...


class ConnectorError(Exception):
    """A scheduler could not be read or changed. ``retryable`` says whether trying again helps."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
