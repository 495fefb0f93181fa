"""Fractional jobs: shares of one GPU (``Job.gpu_milli`` < 1000), planned around the rest.

An instance with fractional jobs is planned in three steps (:func:`plan_with_shares`):

1. :func:`split`: every GPU that running fractional jobs share becomes one synthetic,
   locked whole-GPU job (a *holder*, with those jobs' CPU and memory), and the fractional
   jobs leave the instance. What is left is an instance of whole GPUs only.
2. The whole-GPU instance is planned by the caller's engine (``solve()``, or a greedy
   policy) exactly as any other: holders are frozen, so nothing moves or stops them.
3. :meth:`SharedGpus.complete`: the pending fractional jobs, by weight then submit time,
   each go on one GPU with room for it — one already shared or one the plan leaves idle —
   on the node and GPU where the node's fragmentation for the typical shapes grows least
   (FGD's score, ``solver.fragmentation``; ties: the first node in the instance's order,
   then the lowest GPU index). A job that fits nowhere, with ``config.migration`` on, gets
   room by a repack of a node's checkpointable, migratable fractional jobs onto its other
   GPUs (a migration each, within what the plan left of ``max_migrations_per_cycle``). The
   plan's ``gpu_indices`` name every fractional job's GPU; a move within a node is a
   ``migrate`` action whose reason names both GPUs.
4. With ``config.share_moves_across_nodes`` (off by default), a share that still fits
   nowhere, and first each single-node whole-GPU job the plan left pending for want of
   room, get room by moving checkpointable, migratable shares to other nodes
   (``solver.greedy.share_moves``); such a move is a ``migrate`` action whose reason names
   both nodes and GPUs.

What this does not do (yet): fractional jobs never preempt or get preempted, and count as
one GPU in team quotas and the objective; they may move to another node, but only with
``share_moves_across_nodes`` on (``solver.greedy.share_moves``). MIG jobs
(``Job.mig_profile``) are split off before the shares and placed after them
(``solver.greedy.mig_placement``). An instance without fractional or MIG jobs never comes
here (its plan is unchanged, byte for byte).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from solver.compat import node_accepts
from solver.fragmentation import (
    Shape,
    fgd_score,
    fragmentation_for,
    least_memory,
    typical_shapes,
)
from solver.greedy import mig_placement
from solver.greedy.holders import GpuKey, PlanParts, SplitGpus, holder_jobs, quota_outside
from solver.greedy.share_moves import ShareMoves
from solver.instance import FULL_GPU_MILLI, Instance, Job, NodeState, TypicalShape
from solver.plan import Action, ActionKind, Plan, Reason, ReasonCode

HOLDER_PREFIX = "shared-gpu/"  # synthetic holder ids: shared-gpu/<node>/<index>
UNLIMITED = 1 << 60


def shapes_of(instance: Instance) -> tuple[TypicalShape, ...]:
    """The instance's typical shapes, or its jobs' own when it gives none (each with the
    least memory its jobs ask when ``config.fragmentation_memory`` is on)."""
    if instance.typical_shapes:
        return instance.typical_shapes
    counts: Counter[Shape] = Counter()
    memory: list[tuple[Shape, int]] = []
    for job in instance.jobs:
        models = tuple(sorted(job.allowed_gpu_models or ()))
        shape = (job.cpu_milli_per_replica, job.gpu_milli, job.gpus_per_replica, models)
        counts[shape] += max(1, job.replicas)
        memory.append((shape, job.memory_mib_per_replica))
    least = least_memory(memory) if instance.config.fragmentation_memory else None
    return typical_shapes(counts, memory=least)


@dataclass
class NodeRoom:
    """What a node has free after the whole-GPU plan: per GPU milli, CPU and memory."""

    free: list[int]  # per GPU index: milli free (0 on a GPU a whole-GPU job holds)
    cpu: int
    mem: int
    # Fractional jobs on each shared GPU index: job id -> milli.
    sharing: dict[int, dict[str, int]] = field(default_factory=dict)

    def sharing_index(self, job_id: str) -> int:
        """The GPU the fractional job ``job_id`` is on."""
        return next(i for i, jobs in self.sharing.items() if job_id in jobs)

    def copy(self) -> NodeRoom:
        """A copy of the room (its lists and maps copied too)."""
        return NodeRoom(
            free=list(self.free),
            cpu=self.cpu,
            mem=self.mem,
            sharing={i: dict(jobs) for i, jobs in self.sharing.items()},
        )


@dataclass
class SharedGpus(SplitGpus):
    """An instance split into its whole-GPU part (``whole``) and its fractional jobs."""

    def complete(self, plan: Plan) -> Plan:
        """``plan`` (of ``whole``) with the fractional jobs placed: see the module docstring."""
        return _Completion(self, plan).run()


def split(instance: Instance) -> SharedGpus | None:
    """The whole-GPU part of ``instance`` (holders for its shared GPUs), or None when it
    has no fractional job."""
    if not any(job.is_fractional for job in instance.jobs):
        return None
    shared: dict[tuple[str, int], list[Job]] = {}
    kept: list[Job] = []
    for job in instance.jobs:
        if not job.is_fractional:
            kept.append(job)
            continue
        where = job.shared_gpu
        if where is not None:
            shared.setdefault(where, []).append(job)
    holder_list, holders = holder_jobs(HOLDER_PREFIX, shared)
    kept.extend(holder_list)
    shared_free: dict[str, list[int]] = {}
    for (node, _), jobs in sorted(shared.items()):
        free = FULL_GPU_MILLI - sum(j.gpu_milli for j in jobs)
        shared_free.setdefault(node, []).append(free)
    whole = instance.model_copy(
        update={
            "jobs": tuple(kept),
            "shared_free_milli": {node: tuple(free) for node, free in shared_free.items()},
            "quota_held_outside": quota_outside(instance, shared),
        }
    )
    return SharedGpus(instance=instance, whole=whole, holders=holders)


def plan_with_shares(instance: Instance, plan_whole: Callable[[Instance], Plan]) -> Plan:
    """Plan ``instance``'s whole-GPU part with ``plan_whole``, then its fractional jobs,
    then its MIG jobs (``solver.greedy.mig_placement``)."""
    partitioned = mig_placement.split(instance)
    if partitioned is not None:
        return partitioned.complete(_plan_shares(partitioned.whole, plan_whole))
    return _plan_shares(instance, plan_whole)


def _plan_shares(instance: Instance, plan_whole: Callable[[Instance], Plan]) -> Plan:
    shared = split(instance)
    if shared is None:
        return plan_whole(instance)
    return shared.complete(plan_whole(shared.whole))


class _Completion(ShareMoves):
    def __init__(self, shared: SharedGpus, plan: Plan) -> None:
        self.shared = shared
        self.instance = instance = shared.instance
        self.plan = plan
        self.fragmentation = fragmentation_for(shapes_of(instance))
        self.rooms = self._rooms()
        self.placed: dict[str, tuple[str, int]] = {}  # fractional job -> (node, GPU)
        # Moved fractional job -> (node, GPU) it held, (node, GPU) it goes to.
        self.moved: dict[str, tuple[str, int, str, int]] = {}
        # Pending whole-GPU jobs started on GPUs shares left (``share_moves_across_nodes``).
        self.whole_started: dict[str, tuple[str, tuple[int, ...]]] = {}
        # Trial moves (``ShareMoves._moves_across``): each touched node's room before the trial.
        self._journal: dict[str, NodeRoom] | None = None
        self.pending: dict[str, Reason] = {}
        self.decisions: dict[str, Reason] = {}
        whole_moves = sum(1 for a in plan.actions if a.kind is ActionKind.migrate)
        self.moves_left = instance.config.max_migrations_per_cycle - whole_moves
        self.usage = self._team_usage()

    def _team_usage(self) -> dict[str, int]:
        """Per team, the GPUs counted against its quota after the whole-GPU plan: its
        whole GPUs, one per running share (as ``solver.validate`` counts them) and what it
        holds outside this instance (MIG instances)."""
        usage = dict(self.instance.quota_held_outside)
        whole = self.shared.whole
        for job_id, target in self.plan.placement.items():
            if job_id not in self.shared.holders:
                team = whole.job_by_id[job_id].team
                usage[team] = usage.get(team, 0) + sum(target.values())
        for job in self.instance.jobs:
            if job.shared_gpu is not None:
                usage[job.team] = usage.get(job.team, 0) + 1
        return usage

    def _rooms(self) -> dict[str, NodeRoom]:
        instance = self.instance
        whole = self.shared.whole
        rooms: dict[str, NodeRoom] = {}
        for node in instance.nodes:
            rooms[node.name] = NodeRoom(
                free=[FULL_GPU_MILLI] * node.gpus,
                cpu=node.cpu_milli or UNLIMITED,
                mem=node.memory_mib or UNLIMITED,
            )
        for job_id, target in self.plan.placement.items():
            job = whole.job_by_id[job_id]
            indices = self.plan.gpu_indices.get(job_id, {})
            for node_name, gpus in target.items():
                room = rooms[node_name]
                replicas = gpus // job.gpus_per_replica
                room.cpu -= replicas * job.cpu_milli_per_replica
                room.mem -= replicas * job.memory_mib_per_replica
                if job_id in self.shared.holders:
                    continue
                for index in indices.get(node_name, ()):
                    if 0 <= index < len(room.free):
                        room.free[index] = 0
        for job in instance.jobs:
            where = job.shared_gpu
            if where is None:
                continue
            room = rooms[where[0]]
            room.free[where[1]] -= job.gpu_milli
            room.sharing.setdefault(where[1], {})[job.id] = job.gpu_milli
        return rooms

    def run(self) -> Plan:
        instance = self.instance
        across = instance.config.migration and instance.config.share_moves_across_nodes
        if across:
            self._start_whole_jobs()
        queue = sorted(
            (job for job in instance.jobs if job.is_fractional and not job.is_running),
            key=lambda job: (-instance.weight(job), job.submit_time, job.id),
        )
        for job in queue:
            frozen = instance.frozen_because(job)
            if frozen is not None:
                self.pending[job.id] = Reason(code=ReasonCode.dwell, message=frozen)
                continue
            cap = instance.policy_for(job).quota_cap
            if cap is not None and self.usage.get(job.team, 0) + 1 > cap:
                self.pending[job.id] = Reason(
                    code=ReasonCode.quota, message=f"team {job.team} is at its quota of {cap} GPUs"
                )
                continue
            if self._start(job, across=across):
                self.usage[job.team] = self.usage.get(job.team, 0) + 1
                continue
            self.pending[job.id] = Reason(
                code=ReasonCode.insufficient_capacity,
                message=f"no GPU with {job.gpu_milli} milli free on a node that accepts it",
            )
        return self._plan()

    def _start(self, job: Job, *, across: bool) -> bool:
        """Place a pending share: on the best GPU, else by a repack of one node's shares,
        else (``across``) by moving shares to other nodes. True when placed."""
        choice = self._best_gpu(job)
        if choice is not None:
            self._place(job, *choice, why=ReasonCode.placed)
            return True
        if self.instance.config.migration and self._repack_for(job):
            return True
        return across and self._place_across(job)

    def _fits_node(self, job: Job, node_name: str) -> bool:
        node = self.instance.node_by_name[node_name]
        room = self.rooms[node_name]
        return (
            node.state is NodeState.up
            and room.cpu >= job.cpu_milli_per_replica
            and room.mem >= job.memory_mib_per_replica
            and node_accepts(self.instance, node, job)
        )

    def _best_gpu(self, job: Job, exclude: str | None = None) -> tuple[str, int] | None:
        """The node and GPU where FGD's score is highest (first node, lowest GPU on ties),
        not on ``exclude``."""
        best: tuple[int, str, int] | None = None
        milli = job.gpu_milli
        for node in self.instance.nodes:
            if node.name == exclude:
                continue
            room = self.rooms[node.name]
            if not any(free >= milli for free in room.free):
                continue
            if not self._fits_node(job, node.name):
                continue
            before = self.fragmentation(room.free, room.cpu, node.gpu_model, room.mem)
            cpu_after = room.cpu - job.cpu_milli_per_replica
            mem_after = room.mem - job.memory_mib_per_replica
            tried: set[int] = set()
            for index, free in enumerate(room.free):
                if free < milli or free in tried:
                    continue
                tried.add(free)
                after_free = list(room.free)
                after_free[index] -= milli
                after = self.fragmentation(after_free, cpu_after, node.gpu_model, mem_after)
                score = fgd_score(before - after)
                if best is None or score > best[0]:
                    best = (score, node.name, index)
        return None if best is None else (best[1], best[2])

    def _place(self, job: Job, node_name: str, index: int, *, why: ReasonCode) -> None:
        room = self.rooms[node_name]
        room.free[index] -= job.gpu_milli
        room.cpu -= job.cpu_milli_per_replica
        room.mem -= job.memory_mib_per_replica
        room.sharing.setdefault(index, {})[job.id] = job.gpu_milli
        self.placed[job.id] = (node_name, index)
        self.decisions[job.id] = Reason(
            code=why, message=f"{job.gpu_milli} milli of GPU {index} on {node_name}"
        )

    def _may_move(self, job: Job) -> bool:
        instance = self.instance
        # Not ``migratable``: even another GPU of its node is its scheduler's to choose.
        movable = job.checkpointable and job.migratable
        if not movable or instance.is_frozen(job) or job.id in self.moved:
            return False
        config = instance.config
        if (
            job.last_moved_at is not None
            and instance.now - job.last_moved_at < config.migration_cooldown_s
        ):
            return False
        limit = instance.policy_for(job).max_migrations_per_day
        return limit is None or job.migrations_today < limit

    def _repack_for(self, job: Job) -> bool:
        """Room for ``job`` on one node by moving that node's movable fractional jobs to
        its other GPUs (first-fit decreasing, best fit); the nodes with the most free
        milli first. True when placed."""
        milli = job.gpu_milli
        candidates = [
            node.name
            for node in self.instance.nodes
            if sum(self.rooms[node.name].free) >= milli and self._fits_node(job, node.name)
        ]
        candidates.sort(key=lambda name: -sum(self.rooms[name].free))
        for node_name in candidates[:64]:
            moves = self._repack_node(job, node_name)
            if moves is None:
                continue
            index, assignment = moves
            room = self.rooms[node_name]
            for moved_id, (source, target) in assignment.items():
                share = room.sharing[source].pop(moved_id)
                room.free[source] += share
                room.free[target] -= share
                room.sharing.setdefault(target, {})[moved_id] = share
                self._record_move(moved_id, (node_name, source), (node_name, target))
            self.moves_left -= len(assignment)
            self._place(job, node_name, index, why=ReasonCode.defragmentation)
            return True
        return False

    def _repack_node(
        self, job: Job, node_name: str
    ) -> tuple[int, dict[str, tuple[int, int]]] | None:
        room = self.rooms[node_name]
        jobs = self.instance.job_by_id
        movable: list[tuple[str, int, int]] = []  # (job, GPU, milli)
        fixed = [FULL_GPU_MILLI - free for free in room.free]
        for index, holders in room.sharing.items():
            for other, share in holders.items():
                if other not in self.placed and self._may_move(jobs[other]):
                    movable.append((other, index, share))
                    fixed[index] -= share
        if not movable:
            return None
        movable.sort(key=lambda item: (-item[2], item[0]))
        targets = sorted(
            (i for i, used in enumerate(fixed) if used + job.gpu_milli <= FULL_GPU_MILLI),
            key=lambda i: (fixed[i] - FULL_GPU_MILLI, i),
        )
        for target in targets[:4]:
            left = [FULL_GPU_MILLI - used for used in fixed]
            left[target] -= job.gpu_milli
            assignment: dict[str, tuple[int, int]] = {}
            for other, source, share in movable:
                fits = [i for i, free in enumerate(left) if free >= share]
                if not fits:
                    break
                # Stay where it is when it fits there; else the best fit.
                to = source if source in fits else min(fits, key=lambda i: (left[i], i))
                left[to] -= share
                if to != source:
                    assignment[other] = (source, to)
            else:
                if len(assignment) <= self.moves_left:
                    return target, assignment
        return None

    def _record_move(self, job_id: str, source: GpuKey, target: GpuKey) -> None:
        """``job_id`` goes from ``source`` to ``target``; a job back where it was has not
        moved after all."""
        first = self.moved.get(job_id)
        start = (first[0], first[1]) if first is not None else source
        if start == target:
            self.moved.pop(job_id, None)
        else:
            self.moved[job_id] = (*start, *target)

    def _plan(self) -> Plan:
        instance = self.instance
        parts = PlanParts.without_holders(self.plan, self.shared.holders)
        placement, indices, pending = parts.placement, parts.indices, parts.pending
        actions = parts.actions
        for job in instance.jobs:
            if not job.is_fractional:
                continue
            where = job.shared_gpu
            if where is not None:
                node_name, index = where
                to_placement = dict(job.placement)
                if job.id in self.moved:
                    _, source, to_node, index = self.moved[job.id]
                    if to_node == node_name:
                        message = f"GPU {source} -> GPU {index} on {node_name}"
                    else:
                        message = f"GPU {source} on {node_name} -> GPU {index} on {to_node}"
                        to_placement = {to_node: 1}
                        node_name = to_node
                    actions.append(
                        Action(
                            kind=ActionKind.migrate,
                            job_id=job.id,
                            from_placement=dict(job.placement),
                            to_placement=to_placement,
                            reason=Reason(code=ReasonCode.defragmentation, message=message),
                        )
                    )
                placement[job.id] = to_placement
                indices[job.id] = {node_name: (index,)}
            elif job.id in self.placed:
                node_name, index = self.placed[job.id]
                placement[job.id] = {node_name: 1}
                indices[job.id] = {node_name: (index,)}
                actions.append(
                    Action(
                        kind=ActionKind.start,
                        job_id=job.id,
                        to_placement={node_name: 1},
                        reason=self.decisions[job.id],
                    )
                )
            else:
                pending[job.id] = self.pending[job.id]
        for job_id, (node_name, gpus) in self.whole_started.items():
            pending.pop(job_id, None)
            to_placement = {node_name: len(gpus)}
            placement[job_id] = to_placement
            indices[job_id] = {node_name: gpus}
            actions.append(
                Action(
                    kind=ActionKind.start,
                    job_id=job_id,
                    to_placement=to_placement,
                    reason=self.decisions[job_id],
                )
            )
        started = len(self.placed)
        across = sum(1 for move in self.moved.values() if move[0] != move[2])
        note = f"fractional jobs: {started} placed, {len(self.moved) - across} moved within a node"
        if across or self.whole_started:
            note += f", {across} to another node ({len(self.whole_started)} whole-GPU jobs started)"
        return parts.plan(note)
