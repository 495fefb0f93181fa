"""Defragmentation by migration: a pending block job that does not fit may move
checkpointable single-node jobs off a few nodes (within the per-cycle migration budget)
to make room. It only rearranges what is held, so it needs no value trade; a resident
whose node the job leaves room on stays where it is.

Movable: a running, checkpointable, single-node block job, not frozen, off its migration
cooldown and under its team's daily migration limit; it is moved at most once a cycle.
"""

from __future__ import annotations

from solver.greedy.ledger import Ledger
from solver.greedy.lookahead import Lookahead
from solver.instance import Job
from solver.plan import Reason, ReasonCode


class Defragmentation:
    def __init__(self, ledger: Ledger, lookahead: Lookahead) -> None:
        self.ledger = ledger
        self.lookahead = lookahead
        instance = ledger.instance
        self.movable = (
            {j.id for j in instance.jobs if self._could_move(j)}
            if ledger.options.migrate
            else set()
        )
        # Checkpointable single-node jobs that would be movable but for their dwell.
        self.movable_held_back = {
            j.id
            for j in instance.jobs
            if not j.is_elastic
            and j.checkpointable
            and len(j.placement) == 1
            and instance.is_frozen(j)
        }
        self.failed: dict[tuple[object, ...], bool] = {}  # -> blocked by the budget

    def _could_move(self, job: Job) -> bool:
        """Static part of movability: checkpointable single-node block job, budget left."""
        instance = self.ledger.instance
        if job.is_elastic or not job.is_running or not job.checkpointable:
            return False
        if len(job.placement) != 1 or instance.is_frozen(job):
            return False
        if (
            job.last_moved_at is not None
            and instance.now - job.last_moved_at < self.ledger.config.migration_cooldown_s
        ):
            return False
        limit = instance.policy_for(job).max_migrations_per_day
        return limit is None or job.migrations_today < limit

    def may_move(self, job_id: str) -> bool:
        """Movable and not yet started, moved or stopped this cycle."""
        return job_id in self.movable and job_id not in self.ledger.touched

    def try_defrag(self, job: Job, groups: list[int]) -> dict[int, int] | None:
        """A placement for ``job`` on nodes emptied by moving their residents, or None.
        The moves stay; the caller places the job."""
        ledger = self.ledger
        state = ledger.state
        budget = ledger.config.max_migrations_per_cycle - ledger.migrations
        key = ledger.failure_key(job, ("defrag", budget > 0))
        if key in self.failed:
            if self.failed[key]:
                ledger.budget_blocked.add(job.id)
            return None
        blocked = False
        job_by_id = ledger.instance.job_by_id
        nodes = ledger.instance.nodes
        need = job.total_gpus
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        movable = self.movable
        touched = ledger.touched
        held_back = self.movable_held_back
        for group in state.group_order(self.lookahead.allowed_groups(job, groups)):
            candidates: list[tuple[int, int, int, list[Job]]] = []
            frozen_sizes: list[int] = []  # nodes only frozen residents keep from moving
            for node in ledger.compat.groups[group].node_indices:
                if not state.ready[node] or nodes[node].gpus < job.gpus_per_replica:
                    continue
                on_node = state.jobs_on_node[node]
                if on_node and all(r in held_back or r in movable for r in on_node):
                    if any(r in held_back for r in on_node):
                        frozen_sizes.append(nodes[node].gpus)
                        continue
                if on_node and all(r in movable and r not in touched for r in on_node):
                    candidates.append(
                        (
                            len(on_node),
                            -state.free_gpus[node],
                            node,
                            [job_by_id[r] for r in on_node],
                        )
                    )
            candidates.sort(key=lambda c: (c[0], c[1], c[2]))
            chosen: list[tuple[int, list[Job]]] = []
            capacity = 0
            movers = 0
            for count, _, node, residents in candidates:
                if len(chosen) >= limit or movers + count > budget:
                    continue
                chosen.append((node, residents))
                capacity += nodes[node].gpus - nodes[node].gpus % job.gpus_per_replica
                movers += count
                if capacity >= need:
                    break
            if capacity < need:
                # Would emptying nodes have made room, were the budget larger or no
                # resident within its dwell time?
                sizes = sorted([nodes[c[2]].gpus for c in candidates] + frozen_sizes)
                room = sum(sizes[-limit:])
                if room >= need:
                    ledger.budget_blocked.add(job.id)
                    blocked = True
                continue
            placement = self._evacuate_and_place(job, groups, chosen)
            if placement is not None:
                return placement
        self.failed[key] = blocked
        return None

    def _evacuate_and_place(
        self, job: Job, groups: list[int], chosen: list[tuple[int, list[Job]]]
    ) -> dict[int, int] | None:
        ledger = self.ledger
        state = ledger.state
        mark = state.mark()
        evicted: list[tuple[Job, dict[int, int]]] = []
        for _, residents in chosen:
            for resident in residents:
                evicted.append((resident, state.evict(resident)))
        placement = state.find_gang(job, job.replicas, groups, job.max_nodes)
        if placement is None:
            state.rollback(mark)
            return None
        state.place(job, placement)
        # A resident whose node the job left room on stays: only a move that makes room
        # for the job is "moved to make room" for it.
        homeless: list[Job] = []
        for resident, original in sorted(evicted, key=lambda e: (-e[0].total_gpus, e[0].id)):
            if all(
                state.replicas_fitting(resident, node) * resident.gpus_per_replica >= gpus
                for node, gpus in original.items()
            ):
                state.place(resident, original)
            else:
                homeless.append(resident)
        moved: list[Job] = []
        for resident in homeless:
            resident_groups = state.ready_groups(resident)
            node = state.find_single_node(resident, resident.replicas, resident_groups)
            if node is None:
                state.rollback(mark)
                return None
            state.place(resident, {node: resident.total_gpus})
            moved.append(resident)
        if ledger.migrations + len(moved) > ledger.config.max_migrations_per_cycle:
            state.rollback(mark)
            ledger.budget_blocked.add(job.id)
            return None
        # Keep the evictions; the caller places the job itself.
        for node, gpus in placement.items():
            state.remove(job, node, gpus)
        names = ledger.instance.nodes
        for resident in moved:
            ledger.migrations += 1
            ledger.touch(resident.id)
            ledger.made_room_for[resident.id] = (job.id, frozenset(resident.placement))
            where = ", ".join(sorted(resident.placement))
            ledger.result.decisions[resident.id] = Reason(
                code=ReasonCode.DEFRAGMENTATION,
                message=f"moved to {names[next(iter(state.held(resident.id)))].name} "
                f"to make room on {where} for {job.id}",
            )
        ledger.epoch += 1
        return placement
