"""An Armada API server of the tests' own, for the Armada connector.

A real Armada needs Pulsar, PostgreSQL and Redis besides its server, scheduler and
executors, none of which can run here. This server speaks Armada's real gRPC API — it is
built on the servicer classes armada-client itself ships (``armada_client.armada.*_pb2_grpc``
``SubmitServicer``, ``QueueServiceServicer``, ``EventServicer``, ``JobsServicer`` with their
``add_*Servicer_to_server``), so the connector talks to it through the official client over
a real gRPC connection (``grpc.server`` with a thread pool, on a free port of 127.0.0.1) —
and follows Armada's documented semantics, as listed here with their sources. It is not
Armada: no Pulsar, no fair share, no executor API; what it leaves out is said
below, and what the connector does against a real Armada is untested.

**Job lifecycle** (armadaproject.io, "Core concepts: job lifecycle"; ``pkg/api/event.proto``):
``submitted`` → ``queued`` on submission; the scheduler (:meth:`schedule`, run by the test
when it wants a scheduling round) picks an executor cluster and node → ``leased``
(``cluster_id``) → ``pending`` (pod created) → ``running`` (``cluster_id``, ``node_name``);
then ``succeeded`` or ``failed`` (:meth:`finish`), ``cancelled`` or ``preempted``; a queued
job the scheduler refuses for good ends ``failed`` with cause ``Rejected`` (:meth:`reject`).
Events of a job set are appended in that order, one message each.

**Scheduling** (internal/scheduler/jobdb/job.go ``SchedulingOrderCompare``: within a queue,
lower ``priority`` first, then the earlier submission; a cordoned queue — ``Queue.cordoned``,
"determines whether scheduling is enabled for this queue" in submit.proto — is skipped): a
job runs on the first node (in the order :meth:`add_node` declared them) whose labels satisfy
its pod's ``nodeSelector`` and whose free GPUs cover its request. No fair share between
queues, no preemption by the scheduler itself. **Gangs** (``armadaproject.io/gangId``,
``gangCardinality``, ``gangNodeUniformityLabel``: internal/server/configuration/constants.go,
"all jobs in a gang are guaranteed to be scheduled onto the same cluster at the same
time"): the queued jobs of a queue with one gang id run all at once, when as many as the
cardinality are queued and all fit on the nodes of one executor (and of one value of the
uniformity label, when it is given); else none runs.

**Event streams** (internal/armada/server/event.go ``GetJobSetEvents``): an unknown queue is
NOT_FOUND ("Queue %s does not exist"); with ``errorIfMissing`` a job set that has no events
is NOT_FOUND too; messages come in order with opaque, increasing ids, and those *after*
``from_message_id`` are sent (empty: from the start); ``watch: false`` ends the stream at the
last message there is when it starts, ``watch: true`` keeps it open and sends new messages
as they come. ``Watch`` is ``GetJobSetEvents`` with ``watch`` and ``errorIfMissing``.
:meth:`drop_next_stream` makes the next stream break with UNAVAILABLE after some messages,
as a dropped connection does; :meth:`stop` and :meth:`start` take the whole server away and
back on the same port.

**Submit API** (internal/armada/submit/submit.go): ``SubmitJobs`` to an unknown queue is
NOT_FOUND; an empty job set id, no items, or an item without a pod spec or containers is
INVALID_ARGUMENT; a ``client_id`` already used in the queue answers with the job it made
then and makes nothing (deduplication). ``CancelJobs`` of one job (``job_id``) emits
``cancelling`` and ``cancelled`` (at once: there is no executor to wait for; as Armada's
event conversion does, without the request's ``reason``, which only ``GetJobDetails``
answers, as ``cancel_reason``); a job that has ended is left as it is; a job not in the given queue
or job set is NOT_FOUND. ``CancelJobSet`` cancels every job of the job set in the filter's
states (all when none). :meth:`lag` holds back a job set's new messages, as Pulsar may.
``ReprioritizeJobs`` of ``job_ids``, or of the whole job set when there are none, emits
``reprioritizing`` and ``reprioritized`` with the new priority for every job that has not
ended; the answer maps each job id to "" (or why not, for an unknown id); an empty queue or
job set id is INVALID_ARGUMENT. ``PreemptJobs`` of a leased, pending or running job emits
``preempting`` and ``preempted`` (a preempted job ends); of a queued one does nothing.
Queues: ``CreateQueue`` (ALREADY_EXISTS twice), ``GetQueue`` (NOT_FOUND), ``GetQueues``
(a stream of queues, then an end marker), ``CordonQueue``/``UncordonQueue``.
``GetJobStatus`` answers each job's state (UNKNOWN for ids it does not know);
``GetJobDetails`` each known job's queue, job set, state and cancel reason. No call is
authenticated; the ``authorization`` metadata of submissions and event streams is recorded
(:attr:`authorizations`) so a test can see what a client sent.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from armada_client.armada import (
    event_pb2,
    event_pb2_grpc,
    health_pb2,
    job_pb2,
    job_pb2_grpc,
    submit_pb2,
    submit_pb2_grpc,
)
from google.protobuf import empty_pb2
from google.protobuf.timestamp_pb2 import Timestamp

# Submit's JobState values for the phases a job goes through here.
_STATES = {
    "queued": submit_pb2.QUEUED,
    "leased": submit_pb2.LEASED,
    "pending": submit_pb2.PENDING,
    "running": submit_pb2.RUNNING,
    "succeeded": submit_pb2.SUCCEEDED,
    "failed": submit_pb2.FAILED,
    "cancelled": submit_pb2.CANCELLED,
    "preempted": submit_pb2.PREEMPTED,
    "rejected": submit_pb2.REJECTED,
}
GANG_ID = "armadaproject.io/gangId"
GANG_CARDINALITY = "armadaproject.io/gangCardinality"
GANG_UNIFORMITY = "armadaproject.io/gangNodeUniformityLabel"
ENDED = frozenset({"succeeded", "failed", "cancelled", "preempted", "rejected"})
ACTIVE = frozenset({"leased", "pending", "running"})
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


@dataclass
class ServerJob:
    job_id: str
    queue: str
    job_set: str
    spec: submit_pb2.Job
    state: str = "queued"
    executor: str = ""
    node: str = ""
    priority: float = 0.0
    seq: int = 0
    cancel_reason: str = ""

    @property
    def gpus(self) -> int:
        total = 0
        for pod in self.spec.pod_specs:
            for container in pod.containers:
                quantity = container.resources.requests.get("nvidia.com/gpu")
                total += int(quantity.string) if quantity is not None else 0
        return total

    @property
    def node_selector(self) -> dict[str, str]:
        return dict(self.spec.pod_specs[0].nodeSelector) if self.spec.pod_specs else {}


@dataclass
class ServerNode:
    executor: str
    name: str
    gpus: int
    labels: dict[str, str] = field(default_factory=dict)


class ArmadaTestServer:
    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._lock = threading.Condition()
        self.queues: dict[str, submit_pb2.Queue] = {}
        self.jobs: dict[str, ServerJob] = {}
        self.nodes: list[ServerNode] = []
        self._events: dict[tuple[str, str], list[event_pb2.EventStreamMessage]] = {}
        self._client_ids: dict[tuple[str, str], str] = {}
        self._message_ids = itertools.count(1)
        self._job_seq = itertools.count(1)
        # The JobSetRequests received, in order: what the connector asked to resume from.
        self.event_requests: list[event_pb2.JobSetRequest] = []
        # The ``authorization`` metadata of each call that had one (Armada's token auth).
        self.authorizations: list[str] = []
        self._drop_after: int | None = None
        # Job sets whose new messages are not published yet (:meth:`lag`).
        self._lagging: dict[tuple[str, str], int] = {}
        self._server: grpc.Server | None = None
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        """Serve on a free port, or on the port of an earlier start (a restart)."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        submit_pb2_grpc.add_SubmitServicer_to_server(_Submit(self), server)
        submit_pb2_grpc.add_QueueServiceServicer_to_server(_Queues(self), server)
        event_pb2_grpc.add_EventServicer_to_server(_Events(self), server)
        job_pb2_grpc.add_JobsServicer_to_server(_Jobs(self), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if port == 0:
            raise RuntimeError(f"the Armada test server could not bind 127.0.0.1:{self.port}")
        server.start()
        self._server, self.port = server, port
        return self.address

    def stop(self) -> None:
        """Take the server away: open streams break, new calls find nothing listening."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        with self._lock:
            self._lock.notify_all()

    # --- what the test drives: queues, nodes, the scheduler and executors ---------------------

    def create_queue(self, name: str, *, cordoned: bool = False) -> None:
        with self._lock:
            self.queues[name] = submit_pb2.Queue(name=name, priority_factor=1.0, cordoned=cordoned)

    def add_node(self, executor: str, name: str, *, gpus: int, **labels: str) -> None:
        self.nodes.append(ServerNode(executor=executor, name=name, gpus=gpus, labels=labels))

    def schedule(self) -> list[str]:
        """One scheduling round: queued jobs of uncordoned queues, lower priority first,
        onto the first node that fits; the ids of the jobs it started."""
        started = []
        with self._lock:
            queued = sorted(
                (
                    job
                    for job in self.jobs.values()
                    if job.state == "queued" and not self.queues[job.queue].cordoned
                ),
                key=lambda job: (job.priority, job.seq),
            )
            seen: set[str] = set()
            for job in queued:
                if job.job_id in seen:
                    continue
                gang = job.spec.annotations.get(GANG_ID)
                members = [
                    other
                    for other in queued
                    if other is job
                    or (
                        gang
                        and other.queue == job.queue
                        and other.spec.annotations.get(GANG_ID) == gang
                    )
                ]
                seen.update(member.job_id for member in members)
                size = job.spec.annotations.get(GANG_CARDINALITY, "1")
                if gang and len(members) < (int(size) if size.isdigit() else 1):
                    continue  # a gang runs whole or not at all
                placed = self._place(members, job.spec.annotations.get(GANG_UNIFORMITY))
                for member, node in zip(members, placed or [], strict=False):
                    member.executor, member.node = node.executor, node.name
                    self._emit(member, "leased", cluster_id=node.executor)
                    self._emit(member, "pending", cluster_id=node.executor)
                    self._emit(member, "running", cluster_id=node.executor, node_name=node.name)
                    started.append(member.job_id)
        return started

    def _place(self, members: list[ServerJob], uniform: str | None) -> list[ServerNode] | None:
        """A node for each of ``members`` (one job, or a gang): all on the nodes of one
        executor (and of one value of ``uniform``), first fit; None when they do not fit."""
        groups: dict[tuple[str, str | None], list[ServerNode]] = {}
        for node in self.nodes:
            value = node.labels.get(uniform) if uniform else None
            if uniform and value is None:
                continue
            groups.setdefault((node.executor, value), []).append(node)
        for nodes in groups.values():
            taken: dict[str, int] = {}
            placed = []
            for member in members:
                fit = self._fitting_node(member, nodes, taken)
                if fit is None:
                    break
                taken[fit.name] = taken.get(fit.name, 0) + member.gpus
                placed.append(fit)
            else:
                return placed
        return None

    def _fitting_node(
        self, job: ServerJob, nodes: list[ServerNode], taken: dict[str, int]
    ) -> ServerNode | None:
        for node in nodes:
            used = taken.get(node.name, 0) + sum(
                other.gpus
                for other in self.jobs.values()
                if other.node == node.name and other.state in ACTIVE
            )
            selector = job.node_selector
            if node.gpus - used >= job.gpus and all(
                node.labels.get(key) == value for key, value in selector.items()
            ):
                return node
        return None

    def finish(self, job_id: str, *, failed: str | None = None) -> None:
        """The executor reports the job's end: succeeded, or failed for ``failed``."""
        with self._lock:
            job = self.jobs[job_id]
            if failed is None:
                self._emit(job, "succeeded", cluster_id=job.executor, node_name=job.node)
            else:
                self._emit(
                    job, "failed", cluster_id=job.executor, node_name=job.node, reason=failed
                )

    def reject(self, job_id: str, reason: str) -> None:
        """Armada's scheduler refuses a queued job for good (one no executor can ever run).
        The event API has no rejected event: it is a ``failed`` event with ``cause:
        Rejected`` (event.proto's ``Cause``) and no run; ``GetJobStatus`` says REJECTED."""
        with self._lock:
            job = self.jobs[job_id]
            self._emit(job, "failed", reason=reason, cause=event_pb2.Rejected)
            job.state = "rejected"

    def drop_next_stream(self, *, after: int) -> None:
        """The next event stream breaks (UNAVAILABLE) after ``after`` messages."""
        with self._lock:
            self._drop_after = after

    def lag(self, queue: str, job_set: str, *, lagging: bool = True) -> None:
        """Hold back a job set's messages made from now on (``lagging``), or publish them:
        Armada publishes events through Pulsar, one topic partition per job set, so one
        job set's events can reach a reader before another's that happened earlier."""
        with self._lock:
            if lagging:
                self._lagging[(queue, job_set)] = len(self._events.get((queue, job_set), []))
            else:
                self._lagging.pop((queue, job_set), None)
                self._lock.notify_all()

    def job(self, job_id: str) -> ServerJob:
        with self._lock:
            return self.jobs[job_id]

    def jobs_of(self, queue: str, job_set: str) -> list[ServerJob]:
        with self._lock:
            return [j for j in self.jobs.values() if (j.queue, j.job_set) == (queue, job_set)]

    # --- the state machine --------------------------------------------------------------------

    def _now(self) -> Timestamp:
        stamp = Timestamp()
        stamp.FromDatetime(self._clock())
        return stamp

    def _emit(self, of: ServerJob, kind: str, **fields: Any) -> None:
        """Append one event of job ``of`` to its job set's stream (lock held)."""
        job = of
        if kind in _STATES:
            job.state = kind
        body: dict[str, Any] = {
            "job_id": job.job_id,
            "job_set_id": job.job_set,
            "queue": job.queue,
            "created": self._now(),
            **fields,
        }
        message = event_pb2.EventStreamMessage(
            id=f"{next(self._message_ids)}-0", message=event_pb2.EventMessage(**{kind: body})
        )
        self._events.setdefault((job.queue, job.job_set), []).append(message)
        self._lock.notify_all()

    def _new_job_id(self) -> str:
        """A ULID (Armada's job ids): 48 bits of milliseconds, then 80 bits, here a counter."""
        value = (int(self._clock().timestamp() * 1000) << 80) | next(self._job_seq)
        return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))

    def _queue(self, name: str, context: grpc.ServicerContext, rpc: str) -> submit_pb2.Queue:
        queue = self.queues.get(name)
        if queue is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"[{rpc}] Queue {name} does not exist")
        return queue

    def note_authorization(self, context: grpc.ServicerContext) -> None:
        for key, value in context.invocation_metadata():
            if key == "authorization":
                self.authorizations.append(value)

    def submit(
        self, request: submit_pb2.JobSubmitRequest, context: grpc.ServicerContext
    ) -> submit_pb2.JobSubmitResponse:
        self.note_authorization(context)
        with self._lock:
            self._queue(request.queue, context, "SubmitJobs")
            if not request.job_set_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job set id is empty")
            if not request.job_request_items:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no jobs in the request")
            for index, item in enumerate(request.job_request_items):
                pods = list(item.pod_specs) or (
                    [item.pod_spec] if item.HasField("pod_spec") else []
                )
                if not pods or not all(pod.containers for pod in pods):
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"job {index}: a job needs a pod spec with at least one container",
                    )
            answers = []
            for item in request.job_request_items:
                known = self._client_ids.get((request.queue, item.client_id))
                if item.client_id and known is not None:
                    answers.append(submit_pb2.JobSubmitResponseItem(job_id=known))
                    continue
                job_id = self._new_job_id()
                pods = list(item.pod_specs) or [item.pod_spec]
                spec = submit_pb2.Job(
                    id=job_id,
                    client_id=item.client_id,
                    job_set_id=request.job_set_id,
                    queue=request.queue,
                    namespace=item.namespace,
                    labels=dict(item.labels),
                    annotations=dict(item.annotations),
                    priority=item.priority,
                    pod_specs=pods,
                    created=self._now(),
                    scheduler=item.scheduler,
                )
                job = ServerJob(
                    job_id=job_id,
                    queue=request.queue,
                    job_set=request.job_set_id,
                    spec=spec,
                    priority=item.priority,
                    seq=len(self.jobs),
                )
                self.jobs[job_id] = job
                if item.client_id:
                    self._client_ids[(request.queue, item.client_id)] = job_id
                self._emit(job, "submitted", job=spec)
                self._emit(job, "queued")
                answers.append(submit_pb2.JobSubmitResponseItem(job_id=job_id))
            return submit_pb2.JobSubmitResponse(job_response_items=answers)

    def cancel(self, job: ServerJob, reason: str = "") -> None:
        if job.state not in ENDED:
            job.cancel_reason = reason
            self._emit(job, "cancelling")
            self._emit(job, "cancelled")

    def events_after(self, queue: str, job_set: str, after: str) -> list[Any]:
        stream = self._events.get((queue, job_set), [])
        if (queue, job_set) in self._lagging:
            stream = stream[: self._lagging[(queue, job_set)]]
        if not after:
            return list(stream)
        position = _message_number(after)
        return [m for m in stream if _message_number(m.id) > position]


def _message_number(message_id: str) -> int:
    number, _, _ = message_id.partition("-")
    if not number.isdigit():
        raise ValueError(f"not a message id: {message_id!r}")
    return int(number)


class _Submit(submit_pb2_grpc.SubmitServicer):
    def __init__(self, server: ArmadaTestServer) -> None:
        self.server = server

    def SubmitJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.server.submit(request, context)

    def _job(self, job_id: str, request: Any, context: grpc.ServicerContext) -> ServerJob:
        job = self.server.jobs.get(job_id)
        if job is None or job.queue != request.queue or job.job_set != request.job_set_id:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"job {job_id} not found in queue {request.queue}, job set {request.job_set_id}",
            )
        return job

    def CancelJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        server = self.server
        with server._lock:
            server._queue(request.queue, context, "CancelJobs")
            ids = list(request.job_ids) or ([request.job_id] if request.job_id else [])
            if not ids:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no job id (use CancelJobSet)")
            jobs = [self._job(job_id, request, context) for job_id in ids]
            for job in jobs:
                server.cancel(job, request.reason)
            return submit_pb2.CancellationResult(cancelled_ids=ids)

    def CancelJobSet(self, request: Any, context: grpc.ServicerContext) -> Any:
        server = self.server
        with server._lock:
            server._queue(request.queue, context, "CancelJobSet")
            states = set(request.filter.states)
            for job in server.jobs_of(request.queue, request.job_set_id):
                if not states or _STATES[job.state] in states:
                    server.cancel(job)
            return empty_pb2.Empty()

    def ReprioritizeJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        server = self.server
        with server._lock:
            if not request.queue or not request.job_set_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "queue and job set id are required")
            server._queue(request.queue, context, "ReprioritizeJobs")
            ids = list(request.job_ids) or [
                j.job_id for j in server.jobs_of(request.queue, request.job_set_id)
            ]
            results = {}
            for job_id in ids:
                job = server.jobs.get(job_id)
                if job is None or (job.queue, job.job_set) != (request.queue, request.job_set_id):
                    results[job_id] = f"job {job_id} not found"
                    continue
                results[job_id] = ""
                if job.state in ENDED:
                    continue
                job.priority = request.new_priority
                server._emit(job, "reprioritizing", new_priority=request.new_priority)
                server._emit(job, "reprioritized", new_priority=request.new_priority)
            return submit_pb2.JobReprioritizeResponse(reprioritization_results=results)

    def PreemptJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        server = self.server
        with server._lock:
            if not request.queue or not request.job_set_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "queue and job set id are required")
            server._queue(request.queue, context, "PreemptJobs")
            for job_id in request.job_ids:
                job = self._job(job_id, request, context)
                if job.state in ACTIVE:
                    server._emit(job, "preempting", reason=request.reason)
                    server._emit(job, "preempted", cluster_id=job.executor, reason=request.reason)
            return empty_pb2.Empty()

    def Health(self, request: Any, context: grpc.ServicerContext) -> Any:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Queues(submit_pb2_grpc.QueueServiceServicer):
    def __init__(self, server: ArmadaTestServer) -> None:
        self.server = server

    def CreateQueue(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.server._lock:
            if request.name in self.server.queues:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"queue {request.name} exists")
            self.server.queues[request.name] = request
            return empty_pb2.Empty()

    def GetQueue(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.server._lock:
            return self.server._queue(request.name, context, "GetQueue")

    def GetQueues(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self.server._lock:
            queues = list(self.server.queues.values())
        for queue in queues:
            yield submit_pb2.StreamingQueueMessage(queue=queue)
        yield submit_pb2.StreamingQueueMessage(end=submit_pb2.EndMarker())

    def _cordon(self, request: Any, context: grpc.ServicerContext, cordoned: bool) -> Any:
        with self.server._lock:
            self.server._queue(request.name, context, "CordonQueue").cordoned = cordoned
            return empty_pb2.Empty()

    def CordonQueue(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._cordon(request, context, True)

    def UncordonQueue(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._cordon(request, context, False)


class _Events(event_pb2_grpc.EventServicer):
    def __init__(self, server: ArmadaTestServer) -> None:
        self.server = server

    def GetJobSetEvents(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        server = self.server
        server.note_authorization(context)
        with server._lock:
            server.event_requests.append(request)
            server._queue(request.queue, context, "GetJobSetEvents")
            if request.errorIfMissing and not server._events.get((request.queue, request.id)):
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"[GetJobSetEvents] Jobset {request.id} for queue {request.queue} "
                    "does not exist",
                )
            try:
                pending = server.events_after(request.queue, request.id, request.from_message_id)
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            drop_after, server._drop_after = server._drop_after, None
        sent = 0
        last = request.from_message_id
        while context.is_active():
            for message in pending:
                if drop_after is not None and sent == drop_after:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped (test server)")
                yield message
                sent += 1
                last = message.id
            if not request.watch:
                return
            with server._lock:
                server._lock.wait(timeout=0.2)
                pending = server.events_after(request.queue, request.id, last)

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        as_job_set = event_pb2.JobSetRequest(
            queue=request.queue,
            id=request.job_set_id,
            from_message_id=request.from_id,
            watch=True,
            errorIfMissing=True,
        )
        return self.GetJobSetEvents(as_job_set, context)

    def Health(self, request: Any, context: grpc.ServicerContext) -> Any:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Jobs(job_pb2_grpc.JobsServicer):
    def __init__(self, server: ArmadaTestServer) -> None:
        self.server = server

    def GetJobStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.server._lock:
            states = {
                job_id: _STATES[job.state]
                if (job := self.server.jobs.get(job_id))
                else submit_pb2.UNKNOWN
                for job_id in request.job_ids
            }
        return job_pb2.JobStatusResponse(job_states=states)

    def GetJobDetails(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.server._lock:
            details = {
                job_id: job_pb2.JobDetails(
                    job_id=job_id,
                    queue=job.queue,
                    jobset=job.job_set,
                    state=_STATES[job.state],
                    cancel_reason=job.cancel_reason,
                )
                for job_id in request.job_ids
                if (job := self.server.jobs.get(job_id))
            }
        return job_pb2.JobDetailsResponse(job_details=details)
