"""Assign every idle GPU of a cluster at one instant exactly one cause (``causes``).

Algorithm:

1. Per node, its allocations (trimmed to the node's GPUs, in the order given: data that
   claims more GPUs than a node has must not make the books unbalanced) and its free GPUs.
2. Down node: every GPU is ``draining_down``. Otherwise each allocation's GPUs above its
   owner's demand are ``reservation``, the rest ``allocated_idle`` when measured below the
   threshold, else busy. A draining node's free GPUs are ``draining_down``; a ready node's
   reserved free GPUs are ``reservation``.
3. The ready nodes' remaining free GPUs ("open") are asked about the queue, with the checks of
   ``causes`` in order. Jobs are admissible when they accept the node's model and their
   team has room under its cap for the whole job. Whether a job's gang can be completed is
   measured on the open GPUs of the nodes it accepts, once per job, counting nodes alike
   (model, open GPUs) together.

The answer for a node depends only on (model, open GPUs), so nodes alike are answered once.
Steps 1–2 (``settle``) read only the nodes, allocations and threshold: a caller whose
state changes in its queue or caps alone settles once and classifies each state with it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from solver.diagnosis.causes import IdleCause
from solver.diagnosis.state import ClusterAt, NodeAt, QueuedJobAt
from solver.instance import NodeState


@dataclass(frozen=True, slots=True)
class IdleGpus:
    cause: IdleCause
    node: str
    gpu_model: str
    team: str | None  # the one team the cause belongs to, where there is one
    # Whole GPUs, except a share of a service's replicas above its demand, which the
    # simulator measures in fractions of its GPUs.
    gpus: float


@dataclass(frozen=True, slots=True)
class Diagnosis:
    idle: tuple[IdleGpus, ...]
    capacity_by_model: dict[str, int]
    busy_by_model: dict[str, float]

    @property
    def capacity(self) -> int:
        return sum(self.capacity_by_model.values())

    @property
    def busy(self) -> float:
        return sum(self.busy_by_model.values())

    def gpus_by_cause(self) -> dict[IdleCause, float]:
        counts = dict.fromkeys(IdleCause, 0.0)
        for share in self.idle:
            counts[share.cause] += share.gpus
        return counts


def _one_team(jobs: Iterable[QueuedJobAt]) -> str | None:
    teams = {job.team for job in jobs}
    return teams.pop() if len(teams) == 1 else None


@dataclass(frozen=True, slots=True)
class Settled:
    """Steps 1–2 of a cluster: what its nodes and allocations alone decide (every cause
    but the queue's), and the open GPUs left to ask the queue about. A caller whose
    state changes only in its queue or caps settles once and classifies each state with it
    (``app.diagnosis.service``)."""

    idle: tuple[IdleGpus, ...]
    capacity_by_model: dict[str, int]
    busy_by_model: dict[str, float]
    held_by_team: Counter[str]
    open_nodes: tuple[tuple[NodeAt, int], ...]


def settle(cluster: ClusterAt) -> Settled:
    """Steps 1–2 of ``classify``: reads the nodes, allocations and busy threshold only."""
    capacity_by_model: Counter[str] = Counter()
    busy_by_model: defaultdict[str, float] = defaultdict(float)
    idle: list[IdleGpus] = []
    by_node: dict[str, list[tuple[str, int, float | None, float]]] = {}
    held_by_team: Counter[str] = Counter()
    for allocation in cluster.allocations:
        by_node.setdefault(allocation.node, []).append(
            (allocation.team, allocation.gpus, allocation.busy, allocation.above_demand)
        )
        held_by_team[allocation.team] += allocation.gpus

    open_nodes: list[tuple[NodeAt, int]] = []
    for node in cluster.nodes:
        capacity_by_model[node.gpu_model] += node.gpus
        busy_by_model[node.gpu_model] += 0  # every model appears, idle or not
        if node.state is NodeState.down:
            if node.gpus:
                idle.append(
                    IdleGpus(IdleCause.draining_down, node.name, node.gpu_model, None, node.gpus)
                )
            continue
        room = node.gpus
        for team, gpus, busy, above_demand in by_node.get(node.name, ()):
            held = min(max(gpus, 0), room)
            room -= held
            reserved = min(max(above_demand, 0), held)
            if reserved:
                idle.append(
                    IdleGpus(IdleCause.reservation, node.name, node.gpu_model, team, reserved)
                )
            rest = held - reserved
            if rest and busy is not None and busy < cluster.busy_threshold:
                idle.append(
                    IdleGpus(IdleCause.allocated_idle, node.name, node.gpu_model, team, rest)
                )
            else:
                busy_by_model[node.gpu_model] += rest
        free = room
        if not free:
            continue
        if node.state is NodeState.draining:
            idle.append(IdleGpus(IdleCause.draining_down, node.name, node.gpu_model, None, free))
            continue
        reserved = min(max(node.reserved_gpus, 0), free)
        if reserved:
            idle.append(
                IdleGpus(
                    IdleCause.reservation, node.name, node.gpu_model, node.reserved_for, reserved
                )
            )
        if free - reserved:
            open_nodes.append((node, free - reserved))

    return Settled(
        idle=tuple(idle),
        capacity_by_model=dict(capacity_by_model),
        busy_by_model=dict(busy_by_model),
        held_by_team=held_by_team,
        open_nodes=tuple(open_nodes),
    )


def classify(cluster: ClusterAt, settled: Settled | None = None) -> Diagnosis:
    """Every idle GPU of the cluster with its cause. ``settled``: ``settle(cluster)``,
    or that of a state with the same nodes, allocations and busy threshold."""
    if settled is None:
        settled = settle(cluster)
    idle = list(settled.idle)
    if settled.open_nodes:
        queue_view = _QueueView(cluster, settled.held_by_team, settled.open_nodes)
        for node, open_gpus in settled.open_nodes:
            cause, waiting_team = queue_view.cause(node.gpu_model, open_gpus)
            idle.append(IdleGpus(cause, node.name, node.gpu_model, waiting_team, open_gpus))
    return Diagnosis(
        idle=tuple(idle),
        capacity_by_model=dict(settled.capacity_by_model),
        busy_by_model=dict(settled.busy_by_model),
    )


class _QueueView:
    """The queue as the open GPUs see it: checks 4–9 of ``causes``, memoised per
    (model, open GPUs) and per job."""

    def __init__(
        self,
        cluster: ClusterAt,
        held_by_team: Counter[str],
        open_nodes: tuple[tuple[NodeAt, int], ...],
    ) -> None:
        # Jobs alike answer alike: a long queue of a few shapes costs a few checks.
        self._queue = tuple(dict.fromkeys(cluster.queue))
        self._accepting: dict[str, list[QueuedJobAt]] = {}
        # (model, open GPUs) → how many nodes: a gang's room is counted per shape of node.
        self._open_shapes = Counter((node.gpu_model, gpus) for node, gpus in open_nodes)
        self._admitted = {
            job: job.gpus <= cluster.quota_caps[job.team] - held_by_team[job.team]
            if job.team in cluster.quota_caps
            else True
            for job in self._queue
        }
        self._answers: dict[tuple[str, int], tuple[IdleCause, str | None]] = {}
        self._completable: dict[QueuedJobAt, bool] = {}

    def cause(self, gpu_model: str, open_gpus: int) -> tuple[IdleCause, str | None]:
        key = (gpu_model, open_gpus)
        if key not in self._answers:
            self._answers[key] = self._decide(gpu_model, open_gpus)
        return self._answers[key]

    def _decide(self, gpu_model: str, open_gpus: int) -> tuple[IdleCause, str | None]:
        if not self._queue:
            return IdleCause.no_demand, None
        if gpu_model not in self._accepting:
            self._accepting[gpu_model] = [job for job in self._queue if job.accepts(gpu_model)]
        accepting = self._accepting[gpu_model]
        if not accepting:
            return IdleCause.heterogeneity, None
        admissible = [job for job in accepting if self._admitted[job]]
        if not admissible:
            return IdleCause.quota, _one_team(accepting)
        fitting = [job for job in admissible if job.smallest_piece <= open_gpus]
        startable = [job for job in fitting if self._can_complete(job)]
        if startable:
            return IdleCause.queue_order, _one_team(startable)
        if fitting:
            return IdleCause.gang_waiting, _one_team(fitting)
        return IdleCause.fragmentation, _one_team(admissible)

    def _can_complete(self, job: QueuedJobAt) -> bool:
        """Whether the job's members fit the open GPUs of the nodes it accepts, on at most
        ``max_nodes`` of them (the nodes that hold the most members first)."""
        if job not in self._completable:
            per_member = job.gpus_per_member
            # Members per node, and on how many nodes: nodes alike count alike.
            slots: Counter[int] = Counter()
            for (model, gpus), nodes in self._open_shapes.items():
                if job.accepts(model):
                    slots[gpus // per_member] += nodes
            room, left = 0, job.max_nodes
            for members, nodes in sorted(slots.items(), reverse=True):
                used = nodes if left is None else min(nodes, left)
                room += members * used
                if left is not None:
                    left -= used
                    if not left:
                        break
            self._completable[job] = room >= job.members
        return self._completable[job]
