"""Moves of shares across nodes (``SolverConfig.share_moves_across_nodes``, off by default).

A step of the fractional completion (``solver.greedy.sharing``), taken only with
``config.migration`` and ``config.share_moves_across_nodes`` on (README, the FGD section):
a share that fits nowhere, even after the repack within a node, and first each
single-node whole-GPU job the plan left pending for want of room (not quota or dwell; a
team with a quota cap is skipped), get room by moving checkpointable, migratable shares
off one node to others: for each GPU (or set of GPUs) the fewest shares whose leaving
makes room there, with shares of the node's other GPUs when it still lacks CPU or memory;
each moved share goes where FGD's score is best off that node, and of the first
:data:`OPTIONS` options (fewest moves first) the one whose moves and landing grow the
fragmentation of the nodes touched least is taken. An option where a share finds no other
place is dropped (no move strands a job); the moves are ``migrate`` actions whose reason
names both nodes and GPUs, within what is left of ``max_migrations_per_cycle``.

:class:`ShareMoves` is mixed into the completion (``sharing._Completion``), whose rooms,
placements and moves it reads and changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from solver.compat import node_accepts
from solver.fragmentation import Fragmentation
from solver.greedy.holders import GpuKey
from solver.instance import FULL_GPU_MILLI, Instance, Job, NodeState
from solver.plan import Plan, Reason, ReasonCode

if TYPE_CHECKING:
    from solver.greedy.sharing import NodeRoom

OPTIONS = 8  # moves across nodes: the options tried per job that fits nowhere
# Why a whole-GPU job the plan leaves pending found no room (not quota, dwell, ...).
NO_ROOM = (ReasonCode.insufficient_capacity, ReasonCode.fragmentation, ReasonCode.lower_priority)


class ShareMoves:
    """The moves across nodes of a fractional completion (see the module docstring)."""

    # The completion's state (``sharing._Completion`` sets these).
    instance: Instance
    plan: Plan
    fragmentation: Fragmentation
    rooms: dict[str, NodeRoom]
    placed: dict[str, tuple[str, int]]
    whole_started: dict[str, tuple[str, tuple[int, ...]]]
    _journal: dict[str, NodeRoom] | None
    decisions: dict[str, Reason]
    moves_left: int

    if TYPE_CHECKING:  # the completion's methods

        def _best_gpu(self, job: Job, exclude: str | None = None) -> tuple[str, int] | None: ...

        def _place(self, job: Job, node_name: str, index: int, *, why: ReasonCode) -> None: ...

        def _may_move(self, job: Job) -> bool: ...

        def _record_move(self, job_id: str, source: GpuKey, target: GpuKey) -> None: ...

    def _touch(self, node_name: str) -> NodeRoom:
        """The node's room, saved first when a trial runs (``_restore`` undoes it)."""
        room = self.rooms[node_name]
        journal = self._journal
        if journal is not None and node_name not in journal:
            journal[node_name] = room.copy()
        return room

    def _restore(self) -> dict[str, NodeRoom]:
        """End a trial: every touched room back as it was; returns those rooms."""
        journal = self._journal or {}
        self._journal = None
        after = {name: self.rooms[name] for name in journal}
        self.rooms.update(journal)
        return after

    def _shift(self, job: Job, source: GpuKey, target: GpuKey) -> None:
        """Move a share's milli, CPU and memory from ``source`` to ``target`` (rooms only)."""
        room = self._touch(source[0])
        room.free[source[1]] += room.sharing[source[1]].pop(job.id)
        room.cpu += job.cpu_milli_per_replica
        room.mem += job.memory_mib_per_replica
        room = self._touch(target[0])
        room.free[target[1]] -= job.gpu_milli
        room.cpu -= job.cpu_milli_per_replica
        room.mem -= job.memory_mib_per_replica
        room.sharing.setdefault(target[1], {})[job.id] = job.gpu_milli

    def _movable_on(self, room: NodeRoom, index: int) -> list[Job] | None:
        """The shares on GPU ``index`` that may move, largest first; None when one may not."""
        sharing = room.sharing.get(index, {})
        movable = self._movable_jobs(sharing)
        return movable if len(movable) == len(sharing) else None

    def _movable_jobs(self, sharing: dict[str, int]) -> list[Job]:
        """The shares of ``sharing`` that may move, largest first."""
        jobs = self.instance.job_by_id
        return sorted(
            (jobs[o] for o in sharing if o not in self.placed and self._may_move(jobs[o])),
            key=lambda j: (-j.gpu_milli, j.id),
        )

    def _top_up(
        self, room: NodeRoom, gpus: tuple[int, ...], moving: list[Job], cpu: int, mem: int
    ) -> list[Job] | None:
        """``moving`` and, when the node would still lack ``cpu`` or ``mem``, the movable
        shares of its other GPUs that free the most CPU (fewest first); None: not enough."""
        have_cpu = room.cpu + sum(j.cpu_milli_per_replica for j in moving)
        have_mem = room.mem + sum(j.memory_mib_per_replica for j in moving)
        if have_cpu >= cpu and have_mem >= mem:
            return moving
        others = sorted(
            (
                other
                for index, sharing in room.sharing.items()
                if index not in gpus
                for other in self._movable_jobs(sharing)
            ),
            key=lambda j: (-j.cpu_milli_per_replica, -j.memory_mib_per_replica, j.id),
        )
        chosen = list(moving)
        for other in others:
            chosen.append(other)
            have_cpu += other.cpu_milli_per_replica
            have_mem += other.memory_mib_per_replica
            if have_cpu >= cpu and have_mem >= mem:
                return chosen
        return None

    def _share_evictions(self, job: Job, room: NodeRoom) -> list[tuple[int, list[Job]]]:
        """Per GPU of the node: the fewest movable shares whose leaving makes room for the
        share ``job`` there (one share when one is enough: the smallest such), and, when
        the node lacks CPU or memory for it, shares of its other GPUs."""
        out = []
        cpu, mem = job.cpu_milli_per_replica, job.memory_mib_per_replica
        seen: set[int] = set()  # GPUs with as much free and no share to move: one option
        for index, free in enumerate(room.free):
            movable = self._movable_jobs(room.sharing.get(index, {}))
            if not movable and (free < job.gpu_milli or free in seen):
                continue
            if not movable:
                seen.add(free)
            need = job.gpu_milli - free
            moving: list[Job]
            singles = [j for j in movable if j.gpu_milli >= need]
            if need <= 0:
                moving = []
            elif singles:
                moving = [singles[-1]]
            else:
                moving = []
                for other in movable:
                    moving.append(other)
                    need -= other.gpu_milli
                    if need <= 0:
                        break
                if need > 0:
                    continue
            topped = self._top_up(room, (index,), moving, cpu, mem)
            if topped:
                out.append((index, topped))
        return out

    def _whole_evictions(self, job: Job, room: NodeRoom) -> tuple[tuple[int, ...], list[Job]]:
        """GPUs for the whole-GPU ``job`` on the node: idle ones first, then those whose
        shares may all move (fewest shares first); and the shares to move, with those that
        free CPU or memory it lacks. Empty: none."""
        need = job.total_gpus
        idle = [i for i, free in enumerate(room.free) if free == FULL_GPU_MILLI]
        freeable: list[tuple[int, int, list[Job]]] = []
        if len(idle) < need:
            for index, sharing in room.sharing.items():
                if not sharing or room.free[index] == FULL_GPU_MILLI:
                    continue
                movable = self._movable_on(room, index)
                if movable is not None:
                    freeable.append((len(movable), index, movable))
            freeable.sort(key=lambda item: (item[0], item[1]))
        gpus = idle[:need]
        moving: list[Job] = []
        for _, index, movable in freeable[: need - len(gpus)]:
            gpus.append(index)
            moving.extend(movable)
        if len(gpus) < need:
            return (), []
        chosen = tuple(sorted(gpus))
        cpu = job.replicas * job.cpu_milli_per_replica
        mem = job.replicas * job.memory_mib_per_replica
        topped = self._top_up(room, chosen, moving, cpu, mem)
        if not topped:
            return (), []
        return chosen, topped

    def _moves_across(
        self,
        options: list[tuple[str, tuple[int, ...], list[Job]]],
        take: Callable[[NodeRoom, tuple[int, ...]], None],
    ) -> tuple[str, tuple[int, ...]] | None:
        """Of ``options`` (node, GPUs, shares to move off them), the one whose moves and
        landing (``take``, on the node's room) grow FGD's fragmentation least, over the
        nodes touched; each share goes where FGD's score is best off that node. Applied
        and returned, or None (nothing changed)."""
        nodes = self.instance.node_by_name
        best: tuple[float, int, list[tuple[Job, GpuKey, GpuKey]]] | None = None
        for rank, (node_name, gpus, moving) in enumerate(options):
            self._journal = {}
            self._touch(node_name)
            moves: list[tuple[Job, GpuKey, GpuKey]] = []
            for other in moving:
                target = self._best_gpu(other, exclude=node_name)
                if target is None:
                    break
                source = (node_name, self.rooms[node_name].sharing_index(other.id))
                self._shift(other, source, target)
                moves.append((other, source, target))
            stranded = len(moves) < len(moving)
            if not stranded:
                take(self._touch(node_name), gpus)
            before = dict(self._journal)
            after = self._restore()
            if stranded:
                continue
            growth = 0.0
            for name, old in before.items():
                model = nodes[name].gpu_model
                new = after[name]
                growth += self.fragmentation(new.free, new.cpu, model, new.mem)
                growth -= self.fragmentation(old.free, old.cpu, model, old.mem)
            if best is None or growth < best[0]:
                best = (growth, rank, moves)
        if best is None:
            return None
        _, rank, moves = best
        for other, source, target in moves:
            self._shift(other, source, target)
            self._record_move(other.id, source, target)
        self.moves_left -= len(moves)
        node_name, gpus, _ = options[rank]
        take(self.rooms[node_name], gpus)
        return node_name, gpus

    def _place_across(self, job: Job) -> bool:
        """Room for the share ``job`` on a GPU by moving shares off it to other nodes (the
        options with the fewest moves, first nodes first, at most ``OPTIONS``)."""
        if self.moves_left <= 0:
            return False
        options: list[tuple[int, int, str, tuple[int, ...], list[Job]]] = []
        for order, node in enumerate(self.instance.nodes):
            room = self.rooms[node.name]
            if not room.sharing or not self._accepts(job, node.name):
                continue
            for index, moving in self._share_evictions(job, room):
                if len(moving) <= self.moves_left:
                    options.append((len(moving), order, node.name, (index,), moving))
        options.sort(key=lambda item: (item[0], sum(j.gpu_milli for j in item[4]), item[1]))

        def take(room: NodeRoom, gpus: tuple[int, ...]) -> None:
            room.free[gpus[0]] -= job.gpu_milli
            room.cpu -= job.cpu_milli_per_replica
            room.mem -= job.memory_mib_per_replica

        chosen = self._moves_across([item[2:] for item in options[:OPTIONS]], take)
        if chosen is None:
            return False
        node_name, (index,) = chosen
        # ``take`` has reserved the GPU: hand it back for ``_place`` to record.
        room = self.rooms[node_name]
        room.free[index] += job.gpu_milli
        room.cpu += job.cpu_milli_per_replica
        room.mem += job.memory_mib_per_replica
        self._place(job, node_name, index, why=ReasonCode.defragmentation)
        return True

    def _start_whole_jobs(self) -> None:
        """Pending single-node whole-GPU jobs the plan found no room for, by weight then
        submit time: each on GPUs of one node that moving its shares to other nodes
        frees (``share_moves_across_nodes``)."""
        instance = self.instance
        queue = sorted(
            (
                instance.job_by_id[job_id]
                for job_id, reason in self.plan.pending.items()
                if reason.code in NO_ROOM and job_id in instance.job_by_id
            ),
            key=lambda job: (-instance.weight(job), job.submit_time, job.id),
        )
        for job in queue:
            if (
                self.moves_left <= 0
                or job.is_elastic
                or job.is_running
                or instance.is_frozen(job)
                or instance.policy_for(job).quota_cap is not None
            ):
                continue
            options: list[tuple[int, int, str, tuple[int, ...], list[Job]]] = []
            for order, node in enumerate(instance.nodes):
                room = self.rooms[node.name]
                if node.gpus < job.total_gpus or not room.sharing:
                    continue
                if not self._accepts(job, node.name):
                    continue
                gpus, moving = self._whole_evictions(job, room)
                if gpus and len(moving) <= self.moves_left:
                    options.append((len(moving), order, node.name, gpus, moving))
            options.sort(key=lambda item: (item[0], item[1]))

            def take(room: NodeRoom, gpus: tuple[int, ...], job: Job = job) -> None:
                for index in gpus:
                    room.free[index] = 0
                room.cpu -= job.replicas * job.cpu_milli_per_replica
                room.mem -= job.replicas * job.memory_mib_per_replica

            chosen = self._moves_across([item[2:] for item in options[:OPTIONS]], take)
            if chosen is None:
                continue
            node_name, gpus = chosen
            self.whole_started[job.id] = (node_name, gpus)
            self.decisions[job.id] = Reason(
                code=ReasonCode.defragmentation,
                message=f"GPUs {list(gpus)} on {node_name}, shares moved to other nodes",
            )

    def _accepts(self, job: Job, node_name: str) -> bool:
        node = self.instance.node_by_name[node_name]
        return node.state is NodeState.up and node_accepts(self.instance, node, job)
