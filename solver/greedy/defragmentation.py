"""Defragmentation by migration: a pending block job that does not fit may move
checkpointable single-node jobs off a few nodes (within the per-cycle migration budget)
to make room: whole nodes emptied for a gang, or, for a job that fits on one node, just
enough of one node's residents moved elsewhere. Emptying whole nodes of block jobs onto
GPUs as fast for them only rearranges what is held, so it needs no value trade; making
room on part of a node, moving a job onto GPUs slower for it and moving replicas are
trades (``_pays``). A resident whose node the job leaves room on stays
where it is.

Movable: a running, checkpointable, single-node block job, not frozen, off its migration
cooldown and under its team's daily migration limit; it is moved at most once a cycle.
It moves within its cluster (``config.migration``), else, with
``config.cross_cluster_migration``, to one node of another cluster its ``clusters`` lists
(a federation group's plan); with only the latter, only such jobs are movable, and so is a
job that is not ``migratable`` (its scheduler cannot be told where it goes) whatever the
config. A move to another cluster is always a trade (``_pays``, at
``migration_seconds(across=True)``).

Relocatable (``move_replicas``): a service's replicas on a node being cleared (emptied
for a gang, or made room on for a job that fits one node) restart on other nodes, as many
as left (the service's size does not change; the plan shows it as a resize to the new
placement). A replica holds no state to checkpoint, so such a move uses no migration
budget; each service moves at most once a cycle, not while an action is in flight on it,
and not when work was stopped or moved to make room for it. Without this, one replica of
each of two services on two nodes keeps a whole-node gang waiting with 14 of 16 GPUs free
until demand changes. A service that is not ``migratable`` (its connector cannot choose
which of its replicas leave a node) is not relocatable, and with
``config.replica_moves_shrink_first`` (the control plane's) no move leaves a service fewer
than ``max(1, min_replicas)`` replicas where they are (``_would_stop_a_service``).
"""

from __future__ import annotations

import enum

from solver.greedy.ledger import Ledger
from solver.greedy.lookahead import Lookahead
from solver.instance import Job
from solver.plan import Reason, ReasonCode

# Nodes tried per job when making room by moving only some of a node's residents.
PARTIAL_TRIES = 4


class Role(enum.Enum):
    """What defragmentation may do with a job this cycle (a job with none stays put)."""

    MOVABLE = enum.auto()  # ``Defragmentation.movable``
    HELD_BACK = enum.auto()  # ``movable_held_back``: movable but for its dwell
    RELOCATABLE = enum.auto()  # ``relocatable``: a service's replicas


class Residents(enum.Enum):
    """A node's residents, as ``try_defrag`` sees them."""

    LEAVE = enum.auto()  # every one may leave (``_may_leave``): the node can be emptied
    HELD_BACK = enum.auto()  # all would be movable or relocatable, but some are held back
    STAY = enum.auto()  # anything else (also: no residents)


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
        self.movable_held_back = (
            {
                j.id
                for j in instance.jobs
                if not j.is_elastic
                and j.checkpointable
                and len(j.placement) == 1
                and self._in_scope(j)
                and instance.is_frozen(j)
            }
            if ledger.options.migrate
            else set()
        )
        self.relocatable = (
            {
                j.id
                for j in instance.jobs
                if j.is_elastic and j.placement and not j.locked and j.migratable
            }
            if ledger.options.move_replicas
            else set()
        )
        # The three sets above, disjoint, as one lookup per resident: the node scans below
        # (``try_defrag``, ``_make_room_on_one_node``) and the ``RoleIndex`` ask it of every
        # resident of every node they look at.
        self.role: dict[str, Role] = dict.fromkeys(self.movable_held_back, Role.HELD_BACK)
        self.role.update(dict.fromkeys(self.movable, Role.MOVABLE))
        self.role.update(dict.fromkeys(self.relocatable, Role.RELOCATABLE))
        self.index = RoleIndex(ledger, self.role)
        self.failed: dict[tuple[object, ...], bool] = {}  # -> blocked by the budget

    def _could_move(self, job: Job) -> bool:
        """Static part of movability: checkpointable single-node block job, budget left."""
        return len(job.placement) == 1 and self.could_move_whole(job)

    def could_move_whole(self, job: Job) -> bool:
        """A running checkpointable block job that may move this cycle, on however many
        nodes it runs: in scope, not frozen, off its cooldown, under its daily limit."""
        instance = self.ledger.instance
        if job.is_elastic or not job.is_running or not job.checkpointable:
            return False
        if not self._in_scope(job) or instance.is_frozen(job):
            return False
        if (
            job.last_moved_at is not None
            and instance.now - job.last_moved_at < self.ledger.config.migration_cooldown_s
        ):
            return False
        limit = instance.policy_for(job).max_migrations_per_day
        return limit is None or job.migrations_today < limit

    def _in_scope(self, job: Job) -> bool:
        """Whether the config lets ``job`` move at all: any move (``migration``), or only
        to another cluster its ``clusters`` lists (``cross_cluster_migration`` alone, or a
        job that is not ``migratable``: its scheduler cannot be told where it goes)."""
        config = self.ledger.config
        if job.migratable and (config.migration or not config.cross_cluster_migration):
            return True  # as the greedy's options say (``migrate``)
        if not config.cross_cluster_migration or job.clusters is None:
            return False
        nodes = self.ledger.instance.node_by_name
        return bool(job.clusters - {nodes[n].cluster for n in job.placement})

    def may_move(self, job_id: str) -> bool:
        """Movable and not yet started, moved or stopped this cycle."""
        return job_id in self.movable and job_id not in self.ledger.touched

    def _may_leave(self, job_id: str) -> bool:
        """May leave a node emptied for a gang: a movable job, or a service's replicas
        unless work was stopped or moved this cycle to make room for that service."""
        if job_id in self.ledger.touched:
            return False
        if job_id in self.relocatable:
            return job_id not in self.ledger.room_made_for
        return job_id in self.movable

    def _residents(self, on_node: dict[str, int]) -> Residents:
        """Whether a node's residents may all leave it, are held back from it, or stay."""
        if not on_node:
            return Residents.STAY
        touched = self.ledger.touched
        room_made_for = self.ledger.room_made_for
        role = self.role
        held_back = stays = False
        for resident in on_node:
            kind = role.get(resident)
            if kind is None:
                return Residents.STAY
            if kind is Role.HELD_BACK:
                held_back = True
            elif resident in touched or (kind is Role.RELOCATABLE and resident in room_made_for):
                stays = True  # what ``_may_leave`` refuses
        if held_back:
            return Residents.HELD_BACK
        return Residents.STAY if stays else Residents.LEAVE

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
        per_replica = job.gpus_per_replica
        # One replica per node (``Instance.one_replica_per_node``): a node gives a replica.
        spread = job.replicas > 1 and job.id in ledger.instance.one_replica_per_node
        most = per_replica if spread else None
        self.index.refresh()
        for group in state.group_order(self.lookahead.allowed_groups(job, groups), job):
            # (residents to move, -free GPUs, node, residents, GPUs the job gets there)
            candidates: list[tuple[int, int, int, list[Job], int]] = []
            frozen_sizes: list[int] = []  # nodes only frozen residents keep from moving
            # Every other node of the group has a resident that stays and too few GPUs
            # free: it is neither a candidate nor held back. (The order does not matter:
            # candidates are sorted by a key that ends with the node.)
            scanned = self.index.all_with_role[group].union(
                state.nodes_with_free(group, per_replica)
            )
            for node in scanned:
                if not state.ready[node] or nodes[node].gpus < per_replica:
                    continue
                on_node = state.jobs_on_node[node]
                free = state.free_gpus[node]
                residents = self._residents(on_node)
                if residents is Residents.HELD_BACK:
                    frozen_sizes.append(_capped(nodes[node].gpus, most))
                    continue
                if residents is Residents.LEAVE:
                    usable = _capped(nodes[node].gpus - nodes[node].gpus % per_replica, most)
                    candidates.append(
                        (len(on_node), -free, node, [job_by_id[r] for r in on_node], usable)
                    )
                elif free >= per_replica:
                    # GPUs free already (an empty node, or beside residents that stay):
                    # the gang's other nodes, e.g. one free node and one held by a small
                    # job that can move. Counted first, as they cost no move.
                    usable = _capped(free - free % per_replica, most)
                    candidates.append((0, -free, node, [], usable))
            candidates.sort(key=lambda c: (c[0], c[1], c[2]))
            # Free nodes first; but they take node slots a gang of few nodes (max_nodes)
            # may need for nodes that, emptied, hold more of it, and their GPUs may be
            # held back by CPU or memory: then emptied nodes alone, as before free nodes
            # counted.
            evacuable = [c for c in candidates if c[3]]
            pools = [candidates, evacuable] if len(evacuable) < len(candidates) else [candidates]
            reached = False
            for pool in pools:
                chosen, capacity = _fill(pool, need=need, limit=limit, budget=budget)
                if capacity < need:
                    continue
                reached = True
                placement = self._evacuate_and_place(job, [group], chosen)
                if placement is not None:
                    return placement
            if not reached:
                # Would emptying nodes have made room, were the budget larger or no
                # resident within its dwell time?
                sizes = sorted([c[4] for c in candidates] + frozen_sizes)
                room = sum(sizes[-limit:])
                if room >= need:
                    ledger.budget_blocked.add(job.id)
                    blocked = True
            if not spread:
                placement = self._make_room_on_one_node(job, group, budget)
                if placement is not None:
                    return placement
        self.failed[key] = blocked
        return None

    def _make_room_on_one_node(self, job: Job, group: int, budget: int) -> dict[int, int] | None:
        """Room for a job that fits on one node, made by moving only some of a node's
        residents: the fewest migrations, then the fewest movers (services' replicas
        first), then the least room left over. Every mover is smaller than the job (a
        node with room for the job would have taken it), so each move trades GPUs held
        for more GPUs put to work. Only the first ``PARTIAL_TRIES`` nodes are tried."""
        ledger = self.ledger
        state = ledger.state
        nodes = ledger.instance.nodes
        job_by_id = ledger.instance.job_by_id
        need = job.total_gpus
        role = self.role
        options: list[tuple[int, int, int, int, list[Job]]] = []
        self.index.refresh()
        # With no migration budget left only services' replicas may leave (``_leavers``):
        # only the nodes holding some can make room. (The order does not matter: options
        # are sorted by a key that ends with the node.)
        scanned = (
            ledger.compat.groups[group].node_indices
            if budget > 0
            else sorted(self.index.with_replicas[group])
        )
        for node in scanned:
            if not state.ready[node] or nodes[node].gpus < need:
                continue
            short = need - state.free_gpus[node]
            if short <= 0:
                continue  # held back by CPU or memory, which moving GPUs does not mend
            on_node = state.jobs_on_node[node]
            leavers = self._leavers(on_node, need, short, budget)
            if not leavers:
                continue
            # Services' replicas first (they use no migration budget), then the largest.
            leavers.sort(key=lambda r: (role[r] is not Role.RELOCATABLE, -on_node[r], r))
            chosen: list[Job] = []
            freed = migrations = 0
            for resident in leavers:
                if freed >= short:
                    break
                chosen.append(job_by_id[resident])
                freed += on_node[resident]
                migrations += role[resident] is not Role.RELOCATABLE
            if freed >= short and migrations <= budget:
                options.append((migrations, len(chosen), freed - short, node, chosen))
        options.sort(key=lambda o: (o[0], o[1], o[2], o[3]))
        for _, _, _, node, chosen in options[:PARTIAL_TRIES]:
            placement = self._evacuate_and_place(job, [group], [(node, chosen)], target=node)
            if placement is not None:
                return placement
        return None

    def _leavers(self, on_node: dict[str, int], need: int, short: int, budget: int) -> list[str]:
        """The residents smaller than the job that may leave the node, or none when all of
        them together cannot make the ``short`` GPUs: then no choice among them can, and
        the node is passed without sorting them. With no migration budget left only the
        services' replicas count: they are chosen first, and a plan that also needs a
        migration is over budget anyway."""
        leavers = [r for r, gpus in on_node.items() if gpus < need and self._may_leave(r)]
        if budget <= 0:
            leavers = [r for r in leavers if self.role[r] is Role.RELOCATABLE]
        if sum(on_node[r] for r in leavers) < short:
            return []
        return leavers

    def _evacuate_and_place(
        self,
        job: Job,
        groups: list[int],
        chosen: list[tuple[int, list[Job]]],
        *,
        target: int | None = None,
    ) -> dict[int, int] | None:
        """Move ``chosen`` nodes' residents away and find ``job`` a placement in ``groups``
        (on ``target`` alone when given), or undo everything and return None.

        Making room for part of a node (``target``) and restarting a service's replicas
        elsewhere are trades, kept only when the job's value placed exceeds what the moves
        cost in the objective's units: each migration's time, and the speed a service's
        replicas lose on slower GPUs. Emptying whole nodes of block jobs alone keeps its
        old rule (it only rearranges what is held)."""
        ledger = self.ledger
        state = ledger.state
        if ledger.config.replica_moves_shrink_first and self._would_stop_a_service(chosen):
            return None
        mark = state.mark()
        evicted: list[tuple[Job, dict[int, int]]] = []
        held_before: dict[str, dict[int, int]] = {}
        for emptied, residents in chosen:
            for resident in residents:
                if resident.is_elastic:  # only its replicas on this node leave
                    held_before.setdefault(resident.id, dict(state.held(resident.id)))
                    gpus = state.held(resident.id)[emptied]
                    state.remove(resident, emptied, gpus)
                    evicted.append((resident, {emptied: gpus}))
                else:
                    evicted.append((resident, state.evict(resident)))
        placement: dict[int, int] | None
        if target is not None:
            fits = state.replicas_fitting(job, target) >= job.replicas
            placement = {target: job.total_gpus} if fits else None
        else:
            placement = state.find_gang(job, job.replicas, groups, job.max_nodes)
        if placement is None:
            state.rollback(mark)
            return None
        state.place(job, placement)
        # A resident whose node the job left room on stays: only a move that makes room
        # for the job is "moved to make room" for it.
        homeless: list[tuple[Job, dict[int, int]]] = []
        for resident, original in sorted(evicted, key=lambda e: (-e[0].total_gpus, e[0].id)):
            if all(
                state.replicas_fitting(resident, node) * resident.gpus_per_replica >= gpus
                for node, gpus in original.items()
            ):
                state.place(resident, original)
            else:
                homeless.append((resident, original))
        moved: list[Job] = []
        moved_from: dict[str, dict[int, int]] = {}
        relocated: dict[str, Job] = {}
        for resident, original in homeless:
            ready = state.ready_groups(resident)
            if resident.is_elastic:  # a service's replicas stay in its cluster
                groups = state.in_cluster_of(ready, original)
                if not self._relocate(resident, sum(original.values()), groups):
                    state.rollback(mark)
                    return None
                relocated[resident.id] = resident
                continue
            node = state.find_move_target(resident, ready, original)
            if node is None:
                state.rollback(mark)
                return None
            state.place(resident, {node: resident.total_gpus})
            moved.append(resident)
            moved_from[resident.id] = original
        if ledger.migrations + len(moved) > ledger.config.max_migrations_per_cycle:
            state.rollback(mark)
            ledger.budget_blocked.add(job.id)
            return None
        across = any(self._across(r) for r in moved)
        slowed = {r.id: self.slowdown(r, moved_from[r.id]) for r in moved}
        if (target is not None or relocated or across or any(slowed.values())) and not self._pays(
            job, placement, moved, [(s, held_before[s.id]) for s in relocated.values()], slowed
        ):
            state.rollback(mark)
            return None
        # Keep the evictions; the caller places the job itself.
        for node, gpus in placement.items():
            state.remove(job, node, gpus)
        names = ledger.instance.nodes
        for resident in moved:
            ledger.migrations += 1
            ledger.touch(resident.id)
            ledger.made_room(resident.id, job.id, frozenset(resident.placement))
            where = ", ".join(sorted(resident.placement))
            ledger.result.decisions[resident.id] = Reason(
                code=ReasonCode.defragmentation,
                message=f"moved to {names[next(iter(state.held(resident.id)))].name} "
                f"to make room on {where} for {job.id}",
            )
        for service in relocated.values():
            before, after = held_before[service.id], state.held(service.id)
            left = frozenset(names[n].name for n, g in before.items() if after.get(n, 0) < g)
            # The moved replicas are the service's size, not a scale-up: the CP-SAT pass's
            # base (``GreedyEngine.rebase``) keeps them where they landed.
            base = dict(ledger.after_scale_down.get(service.id, {}))
            for n in set(before) | set(after):
                base[n] = max(0, base.get(n, 0) + after.get(n, 0) - before.get(n, 0))
            ledger.after_scale_down[service.id] = {n: g for n, g in base.items() if g}
            ledger.touch(service.id)
            ledger.made_room(service.id, job.id, left)
            # The plan's action goes from the service's placement at the snapshot: replicas
            # it only got this cycle, moved again, are a scale-up placed elsewhere, and its
            # reason (the scale-up's) stays. Said otherwise, "moved off n2" named a node the
            # action does not leave (tests/solver/test_properties.py, placed_where_it_says).
            vacated = sorted(name for name in left if name in service.placement)
            if vacated:
                ledger.result.decisions[service.id] = Reason(
                    code=ReasonCode.defragmentation,
                    message=f"replicas moved off {', '.join(vacated)} to make room for {job.id}",
                )
        ledger.epoch += 1
        return placement

    def _would_stop_a_service(self, chosen: list[tuple[int, list[Job]]]) -> bool:
        """Whether emptying ``chosen`` would move so many of a service's replicas that
        fewer than ``max(1, min_replicas)`` stay where they are. A scheduler that places
        replicas itself is told only which leave (connectors.base.SupportsReplicaMoves):
        the service shrinks first and grows back once the work made room for has its GPUs
        (solver.dependencies.split_replica_moves), so what stays is all it runs meanwhile."""
        state = self.ledger.state
        names = self.ledger.instance.nodes
        emptied = {names[node].name for node, _ in chosen}
        services = {r.id: r for _, residents in chosen for r in residents if r.is_elastic}
        for service in services.values():
            # What stays of its placement at the snapshot (the split keeps only that:
            # replicas gained this cycle are part of the growth back).
            held = {names[n].name: g for n, g in state.held(service.id).items()}
            stays = sum(
                min(gpus, held.get(node, 0))
                for node, gpus in service.placement.items()
                if node not in emptied
            )
            if stays // service.gpus_per_replica < max(1, service.min_replicas):
                return True
        return False

    def _pays(
        self,
        job: Job,
        placement: dict[int, int],
        moved: list[Job],
        relocated: list[tuple[Job, dict[int, int]]],
        slowed: dict[str, float],
    ) -> bool:
        """Whether starting ``job`` on ``placement`` is worth more than the moves that make
        room for it (``solver.objective``'s units: an hour of a reference GPU): each move's
        time, the time a moved job runs longer on GPUs slower for it (``slowed``, GPU-seconds)
        and the speed a service's replicas lose."""
        ledger = self.ledger
        instance = ledger.instance
        horizon = ledger.config.value_horizon_s
        gain = (
            ledger.weight[job.id]
            * instance.boost(job)
            * sum(gpus * ledger.job_speed(job, n) for n, gpus in placement.items())
        )
        cost = sum(
            ledger.weight[r.id]
            * r.total_gpus
            * instance.migration.migration_seconds(r, across=self._across(r))
            / horizon
            for r in moved
        )
        cost += sum(ledger.weight[r.id] * slowed[r.id] for r in moved) / horizon
        for service, before in relocated:
            speed = {n: ledger.node_speed(n) for n in (*before, *ledger.state.held(service.id))}
            lost = sum(g * speed[n] for n, g in before.items()) - sum(
                g * speed[n] for n, g in ledger.state.held(service.id).items()
            )
            cost += ledger.weight[service.id] * max(0.0, lost)
        return gain > cost

    def slowdown(self, job: Job, before: dict[int, int]) -> float:
        """GPU-seconds moved ``job`` holds its GPUs longer where it lands, on GPUs slower for
        it (its own speed, ``Instance.speeds``, else the models'): its expected run time left
        (the value horizon without an estimate) stretched by the speed ratio. 0 when it
        lands on GPUs as fast or faster. A rate would not do: the job it makes room for
        would have started anyway once GPUs freed, while this one crawls to its end."""
        ledger = self.ledger
        was = sum(gpus * ledger.job_speed(job, node) for node, gpus in before.items())
        now = sum(
            gpus * ledger.job_speed(job, node) for node, gpus in ledger.state.held(job.id).items()
        )
        if now >= was or now <= 0:
            return 0.0
        left = ledger.instance.time_left(job) or ledger.config.value_horizon_s
        return job.total_gpus * left * (was / now - 1.0)

    def _across(self, job: Job) -> bool:
        """Whether moved ``job``'s new node is in another cluster than its old one."""
        nodes = self.ledger.instance.nodes
        by_name = self.ledger.instance.node_by_name
        now = {nodes[n].cluster for n in self.ledger.state.held(job.id)}
        return now != {by_name[n].cluster for n in job.placement}

    def _relocate(self, service: Job, gpus: int, groups: list[int]) -> bool:
        """Place ``gpus`` GPUs of ``service``'s replicas elsewhere, one replica at a time
        where each fits best; False if they do not all fit."""
        state = self.ledger.state
        for _ in range(gpus // service.gpus_per_replica):
            node = state.find_single_node(service, 1, groups)
            if node is None:
                return False
            state.add(service, node, service.gpus_per_replica)
        return True


class RoleIndex:
    """Per node group, the nodes defragmentation may find room on, whatever the cycle has
    done so far: those whose residents all have a ``Role`` (every resident movable, held
    back or a relocatable service; only such a node can be emptied or is held back), and
    those holding a relocatable service's replicas (the only residents that may still
    leave once the migration budget is spent). Both depend only on who holds GPUs on the
    node, so they are kept up to date from the nodes whose holdings changed
    (``ClusterState.take_changed_nodes``) rather than found by scanning every node of a
    group for every job that does not fit: at 100,000 GPUs and tens of thousands of
    pending jobs that scan was the largest part of the greedy's time."""

    def __init__(self, ledger: Ledger, role: dict[str, Role]) -> None:
        self.state = ledger.state
        self.group_of_node = ledger.compat.group_of_node
        self.role = role
        groups = len(ledger.compat.groups)
        self.all_with_role: list[set[int]] = [set() for _ in range(groups)]
        self.with_replicas: list[set[int]] = [set() for _ in range(groups)]
        self._built = False

    def refresh(self) -> None:
        changed = self.state.take_changed_nodes()
        if not self._built:  # the first time, every node
            changed = set(range(len(self.group_of_node)))
            self._built = True
        role = self.role
        for node in changed:
            group = self.group_of_node[node]
            kinds = [role.get(resident) for resident in self.state.jobs_on_node[node]]
            if kinds and None not in kinds:
                self.all_with_role[group].add(node)
            else:
                self.all_with_role[group].discard(node)
            if Role.RELOCATABLE in kinds:
                self.with_replicas[group].add(node)
            else:
                self.with_replicas[group].discard(node)


def _fill(
    candidates: list[tuple[int, int, int, list[Job], int]], *, need: int, limit: int, budget: int
) -> tuple[list[tuple[int, list[Job]]], int]:
    """The candidate nodes taken in order until they give the job ``need`` GPUs, at most
    ``limit`` nodes and ``budget`` migrations (services' replicas restart and use none):
    the nodes with their residents to move, and the GPUs they give."""
    chosen: list[tuple[int, list[Job]]] = []
    capacity = movers = 0
    for _, _, node, residents, usable in candidates:
        count = sum(1 for r in residents if not r.is_elastic)
        if len(chosen) >= limit or movers + count > budget:
            continue
        chosen.append((node, residents))
        capacity += usable
        movers += count
        if capacity >= need:
            break
    return chosen, capacity


def _capped(gpus: int, most: int | None) -> int:
    """``gpus``, at most ``most`` (None: no cap)."""
    return gpus if most is None else min(gpus, most)
