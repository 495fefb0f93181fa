"""Elastic training jobs (``Job.is_resizable``: block jobs that give ``max_replicas``),
planned around the plan of the rest.

Every engine plans an instance whose resizable jobs look rigid (:func:`rigid`): a running
one at the size it holds, a pending one at the size it asks (``replicas``). The baselines
stop there. The shaper, with ``SolverConfig.elastic_training`` on, pulls three levers
(:func:`plan_with_elastic_training`; the second and third have switches of their own,
``elastic_smaller_starts`` and ``elastic_growth``). A running job is resized only when it may be
restarted where the plan puts it: checkpointable, ``migratable`` (its scheduler can be
told where it goes) and not frozen (``Instance.is_frozen``: dwell, move budget, a saga).

1. *Shrink instead of stop* (:func:`split`). Such a job that holds more than
   ``min_replicas``, is preemptible and within its SLA's preemptions per day is shown to
   the inner solve as its *core* (``min_replicas`` replicas where it holds most; it
   neither moves nor stops this cycle) and one one-replica *extra* per replica above the
   core, on the node that replica is on. Extras up to the asked size weigh
   ``SHRINK_WEIGHT`` of the job, those above it (grown into idle GPUs) ``GROWN_WEIGHT``;
   they are checkpointable and never moved. The inner engines then take extras before
   they stop whole jobs (preemption stops the lowest weights first, and only for work
   worth more, within its per-cycle cap), and each extra stopped is a replica the job
   gives back: the job shrinks (one ``resize`` action: a checkpoint and a restart at the
   smaller size, on nodes it held). Elastic services are not involved: they have their
   own resize (``solver.greedy.elastic``).
2. *Start smaller* (:class:`_Fill`). A pending checkpointable resizable job the plan
   leaves waiting for want of room (``ROOM_CODES``: not for a reservation, its quota or
   the queue's order) starts at the largest size from ``replicas`` down to
   ``min_replicas`` that fits in what the plan leaves free, on one GPU model of one
   cluster (a gang runs at its slowest GPU) within its node limit (``Job.node_limit``) —
   jobs past their max queue wait first, then by weight.
3. *Grow* (:class:`_Fill`). A job the plan starts then grows toward ``max_replicas`` on
   what is still free at no cost (it has not run yet); a running one the plan leaves as it
   is grows when the run time it saves pays for the restart: time left × (1 − now/new) >
   ``PAYBACK`` × ``migration_seconds``, within what the plan's migrations leave of
   ``max_migrations_per_cycle``, only with ``config.migration`` on and not within
   ``migration_cooldown_s`` of its last move or resize (a job shrunk for an arrival does
   not grow back at the next plan). Only a job that
   could be shrunk again grows (checkpointable, ``migratable``), so the GPUs it takes
   stay within reach of a service's coming peak or a waiting gang; no job grows while
   shares of a GPU or MIG slices wait (they are placed after this plan, on the GPUs
   growth would take). Growth stays on its cluster, on GPU models no slower for the job
   than the slowest it holds, within the node limit at its new size (``max_nodes``
   scaled with the size); largest weight first. The solver has no scaling curve: it
   takes a job's speed as linear in its replicas, which overstates what growth gains for
   a job that scales worse (the simulator runs each job at its own scaling).

The extras' weights only order the inner engines' choices: the plan returned is scored
with ``solver.objective`` on the instance itself, so its ``best_bound`` (a bound of the
inner problem) is dropped when extras were made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from solver.actions import build_plan
from solver.compat import node_accepts
from solver.instance import Instance, Job, NodeState
from solver.plan import Plan, Reason, ReasonCode

EXTRA_SEPARATOR = "#replica-"  # an extra's id: <job id>#replica-<n>
SHRINK_WEIGHT = 0.5  # an extra between min_replicas and the asked size, × the job's weight
GROWN_WEIGHT = 0.05  # an extra above the asked size (grown into idle GPUs), × its weight
PAYBACK = 2.0  # a running job grows when it saves more than this × the restart's time
# Why a pending job waits when a smaller start may be all it lacks (not a reservation, its
# quota, the queue's order, its models or its dwell, which hold for a smaller start too).
ROOM_CODES = frozenset(
    {
        ReasonCode.insufficient_capacity,
        ReasonCode.fragmentation,
        ReasonCode.lower_priority,
        ReasonCode.disruption_budget,
    }
)


def _placed_on(gpus: dict[str, int]) -> str:
    """'placed on n1:2, n2:1' (GPUs per node), as every start's reason ends."""
    return "placed on " + ", ".join(f"{n}:{g}" for n, g in sorted(gpus.items()))


def rigid(instance: Instance) -> Instance:
    """``instance`` with every resizable job made rigid: a running one at the size it
    holds, a pending one at ``replicas``. The instance itself when it has none."""
    if not any(job.is_resizable for job in instance.jobs):
        return instance
    jobs = tuple(_rigid_copy(job) if job.is_resizable else job for job in instance.jobs)
    return instance.model_copy(update={"jobs": jobs})


def _rigid_copy(job: Job, **update: object) -> Job:
    replicas = job.held_gpus // job.gpus_per_replica if job.placement else job.replicas
    fields: dict[str, object] = {
        "replicas": replicas,
        "min_replicas": 0,
        "max_replicas": None,
        "max_nodes": job.node_limit(replicas),
    }
    fields.update(update)
    return job.model_copy(update=fields)


@dataclass
class Split:
    """An instance whose shrinkable jobs are shown as core and extras (``inner``)."""

    instance: Instance
    inner: Instance
    extras: dict[str, str] = field(default_factory=dict)  # extra id -> job id


def split(instance: Instance) -> Split:
    """The inner instance: see the module docstring, lever 1."""
    jobs: list[Job] = []
    extras: dict[str, str] = {}
    speeds = dict(instance.speeds)
    taken = set(instance.job_by_id)
    for job in instance.jobs:
        if not job.is_resizable:
            jobs.append(job)
            continue
        held = job.held_gpus // job.gpus_per_replica
        if not job.placement or held <= job.min_replicas or not _may_restart(instance, job):
            jobs.append(_rigid_copy(job))
            continue
        limit = instance.policy_for(job).max_preemptions_per_day
        if not instance.is_preemptible(job) or (
            limit is not None and job.preemptions_today >= limit
        ):
            jobs.append(_rigid_copy(job))  # a shrink stops part of it: not this one
            continue
        pieces = _carve(job, held)
        ids = [f"{job.id}{EXTRA_SEPARATOR}{n}" for n in range(1, len(pieces) + 1)]
        if taken.intersection(ids):  # an id of the instance's own: leave the job rigid
            jobs.append(_rigid_copy(job))
            continue
        core_placement = dict(job.placement)
        for node in pieces:
            core_placement[node] -= job.gpus_per_replica
        cluster = instance.node_by_name[next(iter(job.placement))].cluster
        here = frozenset({cluster})
        core = _rigid_copy(
            job,
            replicas=job.min_replicas,
            placement={n: g for n, g in core_placement.items() if g},
            gpu_indices=None,
            migratable=False,
            preemptible=False,
            clusters=here,
        )
        jobs.append(core)
        grown = max(0, held - job.replicas)  # the first pieces: given back first
        for rank, (extra_id, node) in enumerate(zip(ids, pieces, strict=True)):
            share = GROWN_WEIGHT if rank < grown else SHRINK_WEIGHT
            jobs.append(
                _rigid_copy(
                    job,
                    id=extra_id,
                    replicas=1,
                    placement={node: job.gpus_per_replica},
                    gpu_indices=None,
                    priority=job.priority * share,
                    migratable=False,
                    preemptible=True,
                    checkpointable=True,
                    clusters=here,
                )
            )
            extras[extra_id] = job.id
            if job.id in speeds:
                speeds[extra_id] = speeds[job.id]
    if not extras:
        return Split(instance, rigid(instance))
    inner = instance.model_copy(update={"jobs": tuple(jobs), "speeds": speeds})
    return Split(instance, inner, extras)


def _may_restart(instance: Instance, job: Job) -> bool:
    """Whether a running job may be resized now: a checkpoint to restart from, a scheduler
    that can be told where it goes (a resize places it), and not frozen."""
    return job.checkpointable and job.migratable and not instance.is_frozen(job)


def _carve(job: Job, held: int) -> list[str]:
    """The nodes of the replicas above the core, one entry per replica, first the ones to
    give back first: the core stays where the job holds most (fewest nodes), the extras
    come off the nodes where it holds least."""
    order = sorted(job.placement, key=lambda n: (-job.placement[n], n))
    per = job.gpus_per_replica
    keep = job.min_replicas
    pieces: list[str] = []
    for node in order:
        replicas = job.placement[node] // per
        kept = min(keep, replicas)
        keep -= kept
        pieces.extend([node] * (replicas - kept))
    pieces.reverse()  # off the nodes where it holds least first
    assert len(pieces) == held - job.min_replicas
    return pieces


def plan_with_elastic_training(
    instance: Instance, plan_rest: Callable[[Instance], Plan], *, grow: bool = True
) -> Plan:
    """Plan ``instance`` with ``plan_rest`` (the shaper's solve) and the three levers of
    the module docstring when ``config.elastic_training`` is on; with it off, or without
    resizable jobs, the rigid instance's plan. ``grow`` False: no growth (shares of a GPU
    or MIG slices wait to be placed after this plan, on GPUs growth would take)."""
    if not any(job.is_resizable for job in instance.jobs):
        return plan_rest(instance)
    if not instance.config.elastic_training:
        return plan_rest(rigid(instance))
    parts = split(instance)
    inner_plan = plan_rest(parts.inner)
    target, decisions, pending = _merge(parts, inner_plan)
    fill = _Fill(instance, target, decisions, pending)
    config = instance.config
    if config.elastic_smaller_starts:
        fill.start_smaller()
    if grow and config.elastic_growth:
        fill.grow()
    stats = inner_plan.stats.model_copy()
    if parts.extras:
        stats.best_bound = None
        stats.gap = None
    plan = build_plan(
        instance,
        policy=inner_plan.policy,
        target=target,
        decisions=decisions,
        pending=pending,
        stats=stats,
    )
    note = fill.note()
    if note:
        plan.stats.note = f"{plan.stats.note}; {note}" if plan.stats.note else note
    return plan


def _merge(
    parts: Split, plan: Plan
) -> tuple[dict[str, dict[str, int]], dict[str, Reason], dict[str, Reason]]:
    """The inner plan on the instance's own jobs: each job's core and kept extras back in
    one placement, a shrink explained by what took its replicas."""
    instance = parts.instance
    target: dict[str, dict[str, int]] = {}
    for job_id, placement in plan.placement.items():
        if job_id not in parts.extras:
            target[job_id] = dict(placement)
    decisions = {action.job_id: action.reason for action in plan.actions}
    pending = {k: v for k, v in plan.pending.items() if k not in parts.extras}
    taken: dict[str, Reason] = {}
    for extra_id, job_id in parts.extras.items():
        stopped_by = decisions.pop(extra_id, None)
        kept = plan.placement.get(extra_id)
        if kept:
            held = target.setdefault(job_id, {})
            for node, gpus in kept.items():
                held[node] = held.get(node, 0) + gpus
        elif stopped_by is not None:
            taken.setdefault(job_id, stopped_by)
    for job_id, why in taken.items():
        job = instance.job_by_id[job_id]
        before = job.held_gpus // job.gpus_per_replica
        after = sum(target.get(job_id, {}).values()) // job.gpus_per_replica
        decisions[job_id] = Reason(
            code=ReasonCode.shrunk,
            message=f"shrunk from {before} to {after} replicas (min {job.min_replicas}) "
            f"instead of stopping work: {why.message}",
        )
    return target, decisions, pending


class _Fill:
    """Levers 2 and 3 on what the merged plan leaves free."""

    def __init__(
        self,
        instance: Instance,
        target: dict[str, dict[str, int]],
        decisions: dict[str, Reason],
        pending: dict[str, Reason],
    ) -> None:
        self.instance = instance
        self.target = target
        self.decisions = decisions
        self.pending = pending
        self.started_small = 0
        self.grown = 0
        self.free_gpus: dict[str, int] = {}
        self.free_cpu: dict[str, int] = {}
        self.free_mem: dict[str, int] = {}
        for node in instance.nodes:
            self.free_gpus[node.name] = node.gpus if node.state is NodeState.up else 0
            self.free_cpu[node.name] = node.cpu_milli
            self.free_mem[node.name] = node.memory_mib
        self.team_gpus: dict[str, int] = dict(instance.quota_held_outside)
        self.migrations = 0  # running jobs the plan moves (to another placement, same size)
        for job in instance.jobs:
            after = target.get(job.id)
            if job.placement and after and after != job.placement:
                self.migrations += sum(after.values()) == job.held_gpus
            for name, gpus in target.get(job.id, {}).items():
                self._take(job, name, gpus)
            self.team_gpus[job.team] = self.team_gpus.get(job.team, 0) + sum(
                target.get(job.id, {}).values()
            )

    def _take(self, job: Job, node: str, gpus: int) -> None:
        replicas = gpus // job.gpus_per_replica
        if not (job.is_fractional or job.is_mig):
            self.free_gpus[node] -= gpus
        self.free_cpu[node] -= replicas * job.cpu_milli_per_replica
        self.free_mem[node] -= replicas * job.memory_mib_per_replica

    def _room(self, job: Job, node: str) -> int:
        """Replicas of ``job`` that fit on ``node`` in what is left."""
        per = job.gpus_per_replica
        room = self.free_gpus[node] // per
        if job.id in self.instance.one_replica_per_node:
            room = min(room, 0 if self.target.get(job.id, {}).get(node) else 1)
        if self.instance.node_by_name[node].cpu_milli and job.cpu_milli_per_replica:
            room = min(room, self.free_cpu[node] // job.cpu_milli_per_replica)
        if self.instance.node_by_name[node].memory_mib and job.memory_mib_per_replica:
            room = min(room, self.free_mem[node] // job.memory_mib_per_replica)
        return max(0, room)

    def _quota_room(self, job: Job) -> int | None:
        """Replicas the job's team may still add under its quota (None: no cap)."""
        cap = self.instance.policy_for(job).quota_cap
        if cap is None:
            return None
        return max(0, cap - self.team_gpus.get(job.team, 0)) // job.gpus_per_replica

    def _nodes_for(self, job: Job) -> list[str]:
        instance = self.instance
        clusters = job.clusters
        return [
            node.name
            for node in instance.nodes
            if node.state is NodeState.up
            and (clusters is None or node.cluster in clusters)
            and node_accepts(instance, node, job)
        ]

    def _add(self, job: Job, placement: dict[str, int]) -> None:
        held = self.target.setdefault(job.id, {})
        for node, replicas in placement.items():
            gpus = replicas * job.gpus_per_replica
            held[node] = held.get(node, 0) + gpus
            self._take(job, node, gpus)
            self.team_gpus[job.team] = self.team_gpus.get(job.team, 0) + gpus

    # -- lever 2 --------------------------------------------------------------------

    def start_smaller(self) -> None:
        instance = self.instance
        waiting = [
            job
            for job in instance.jobs
            if job.is_resizable
            and job.checkpointable  # one started small may be grown back (and shrunk)
            and not job.placement
            and not self.target.get(job.id)
            and not instance.is_frozen(job)
            and self._for_want_of_room(job)
        ]
        waiting.sort(
            key=lambda j: (not instance.is_overdue(j), -instance.weight(j), j.submit_time, j.id)
        )
        for job in waiting:
            best = self._largest_fit(job)
            if best is None:
                continue
            replicas, placement = best
            self._add(job, placement)
            self.pending.pop(job.id, None)
            self.started_small += 1
            self.decisions[job.id] = Reason(
                code=ReasonCode.overdue if instance.is_overdue(job) else ReasonCode.placed,
                message=f"started at {replicas} of the {job.replicas} replicas it asks "
                f"(min {job.min_replicas}): no room for all of them; "
                f"{_placed_on(self.target[job.id])}",
            )

    def _for_want_of_room(self, job: Job) -> bool:
        """Whether the plan leaves ``job`` waiting for want of room (not for a reservation,
        its quota, the queue's order or its models), so a smaller start is all it lacks."""
        reason = self.pending.get(job.id)
        return reason is None or reason.code in ROOM_CODES

    def _largest_fit(self, job: Job) -> tuple[int, dict[str, int]] | None:
        """The most replicas (≤ asked, ≥ min) that fit on one GPU model of one cluster,
        and where; None when not even ``min_replicas`` fit."""
        groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for name in self._nodes_for(job):
            room = self._room(job, name)
            if room > 0:
                node = self.instance.node_by_name[name]
                groups.setdefault((node.cluster, node.gpu_model), []).append((room, name))
        limit = job.replicas
        quota = self._quota_room(job)
        if quota is not None:
            limit = min(limit, quota)
        best: tuple[float, int, dict[str, int]] | None = None
        for (_, model), rooms in sorted(groups.items()):
            rooms.sort(key=lambda r: (-r[0], r[1]))
            spread = job.node_limit(job.replicas)
            if spread is not None:
                rooms = rooms[:spread]
            replicas = min(limit, sum(r for r, _ in rooms))
            if replicas < job.min_replicas or replicas < 1:
                continue
            value = replicas * self.instance.job_speed(job, model)
            if best is None or value > best[0] + 1e-9:
                placement: dict[str, int] = {}
                left = replicas
                for room, name in rooms:
                    if left == 0:
                        break
                    placement[name] = min(room, left)
                    left -= placement[name]
                best = (value, replicas, placement)
        return None if best is None else (best[1], best[2])

    # -- lever 3 --------------------------------------------------------------------

    def grow(self) -> None:
        instance = self.instance
        candidates = []
        config = instance.config
        for job in instance.jobs:
            # Only a job that can be shrunk again grows: the GPUs it takes are idle now,
            # not reserved (a service's coming peak, a waiting gang takes them back).
            if not job.is_resizable or not _may_restart(instance, job):
                continue
            planned = self.target.get(job.id)
            if not planned:
                continue
            if job.placement and (planned != job.placement or not config.migration):
                continue  # the plan moves or shrinks it, or restarts are off: leave it so
            moved = job.last_moved_at
            if job.placement and moved is not None:
                if instance.now - moved < config.migration_cooldown_s:
                    continue  # moved or resized lately: growing back now is churn
            candidates.append(job)
        candidates.sort(key=lambda j: (-instance.weight(j), j.submit_time, j.id))
        # A running job's resize is a restart where the plan puts it: within what the
        # plan's migrations left of the per-cycle budget.
        resizes_left = config.max_migrations_per_cycle - self.migrations
        for job in candidates:
            starting = not job.placement
            if not starting and resizes_left <= 0:
                continue
            extra = self._growth(job, starting)
            if not extra:
                continue
            before = sum(self.target[job.id].values()) // job.gpus_per_replica
            self._add(job, extra)
            after = before + sum(extra.values())
            self.grown += 1
            if starting:
                reason = self.decisions.get(job.id)
                code = reason.code if reason is not None else ReasonCode.placed
                self.decisions[job.id] = Reason(
                    code=code,
                    message=f"started at {after} replicas (asks {job.replicas}, max "
                    f"{job.max_replicas}), the rest on GPUs nothing else takes; "
                    f"{_placed_on(self.target[job.id])}",
                )
            else:
                resizes_left -= 1
                self.decisions[job.id] = Reason(
                    code=ReasonCode.grown,
                    message=f"grown from {before} to {after} replicas (max {job.max_replicas}) "
                    "into GPUs nothing else takes",
                )

    def _growth(self, job: Job, starting: bool) -> dict[str, int]:
        """Replicas to add per node (empty: none, or not worth the restart)."""
        instance = self.instance
        held = self.target[job.id]
        per = job.gpus_per_replica
        now = sum(held.values()) // per
        most = (job.max_replicas or now) - now
        quota = self._quota_room(job)
        if quota is not None:
            most = min(most, quota)
        if most <= 0:
            return {}
        nodes = instance.node_by_name
        cluster = nodes[next(iter(held))].cluster
        slowest = min(instance.job_speed(job, nodes[n].gpu_model) for n in held)
        usable = [
            name
            for name in self._nodes_for(job)
            if nodes[name].cluster == cluster
            and instance.job_speed(job, nodes[name].gpu_model) >= slowest - 1e-9
        ]
        # Nodes it holds first (no new node for the gang), then the roomiest.
        usable.sort(key=lambda n: (n not in held, -self._room(job, n), n))
        extra: dict[str, int] = {}
        spread = len(held)
        limit = job.node_limit(job.max_replicas or now)
        for name in usable:
            if most <= 0:
                break
            room = min(self._room(job, name), most)
            if room <= 0:
                continue
            if name not in held:
                if limit is not None and spread >= limit:
                    continue
                spread += 1
            extra[name] = room
            most -= room
        # What it may spread over at the size it reaches (Job.node_limit).
        while extra and (limit := job.node_limit(now + sum(extra.values()))) is not None:
            if len(held.keys() | extra.keys()) <= limit:
                break
            extra.pop(next(reversed(extra)))  # the last node taken, the smallest
        added = sum(extra.values())
        if not added or starting:
            return extra
        left = instance.time_left(job)
        if left is None:
            return {}
        saved = left * (1.0 - now / (now + added))
        if saved <= PAYBACK * instance.migration.migration_seconds(job):
            return {}
        return extra

    def note(self) -> str:
        parts = []
        if self.started_small:
            parts.append(f"{self.started_small} elastic job(s) started smaller")
        if self.grown:
            parts.append(f"{self.grown} grown")
        return ", ".join(parts)


__all__ = ["Split", "plan_with_elastic_training", "rigid", "split"]
