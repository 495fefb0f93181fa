"""The greedy engine: its phases in order over one cycle's cluster state, and the narrow
face the CP-SAT pass (``solver.solve``) works through.

``run()``:

1. Services scale down to their targets (``elastic``).
2. Jobs past their max queue wait are admitted first (``admission``): they outrank
   service growth.
3. Services scale up, and with ``disrupt_for_services`` move or stop block work to meet
   demand (``elastic``).
4. Look-ahead reservations for services' coming peaks (``lookahead``), if enabled.
5. The rest of the queue in the policy's order (``admission``, which calls on
   ``preemption``, ``defragmentation`` and ``backfill``).
6. A reason for every job left pending (``diagnosis``).

After ``run()`` the CP-SAT pass asks the engine for a base state (``rebase``: the greedy's
disruptions kept, its new starts and scale-ups undone), for what the model must respect
(``reservations``, ``team_min_start``, ``migrations_left``, ``may_move``), records what
the model's solution does (``move``, ``admit``), lets the engine ``fill`` what it did not
place, and asks whether a plan keeps the engine's promises (``broken_promise``). The
phases' own bookkeeping stays inside.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from solver.actions import build_plan
from solver.compat import Compatibility
from solver.elastic_training import rigid
from solver.greedy.admission import Admission
from solver.greedy.defragmentation import Defragmentation
from solver.greedy.diagnosis import Diagnosis
from solver.greedy.elastic import ElasticGrowth
from solver.greedy.ledger import GreedyResult, Ledger
from solver.greedy.lookahead import Lookahead, Reservation
from solver.greedy.options import GreedyOptions, sort_key
from solver.greedy.preemption import Preemption
from solver.greedy.sharing import plan_with_shares
from solver.greedy.upgrades import Upgrades
from solver.instance import Instance, Job
from solver.plan import Plan, Reason, ReasonCode, SolveStats, SolveStatus
from solver.state import ClusterState


@dataclass
class Rebase:
    """What ``GreedyEngine.rebase`` undid, by node index: the CP-SAT hint, and the
    services left short of their target on the base state."""

    starts: dict[str, dict[int, int]]  # block job -> GPUs per node of its greedy start
    scale_ups: dict[str, dict[int, int]]  # service -> GPUs per node the greedy added
    missing: dict[str, int]  # service -> replicas short of its target


class GreedyEngine:
    def __init__(
        self, instance: Instance, options: GreedyOptions, compat: Compatibility | None = None
    ) -> None:
        self._ledger = ledger = Ledger(instance, options, compat)
        self._lookahead = Lookahead(ledger)
        self._preemption = Preemption(ledger, self._lookahead)
        self._defragmentation = Defragmentation(ledger, self._lookahead)
        self._admission = Admission(
            ledger, self._lookahead, self._preemption, self._defragmentation
        )
        self._elastic = ElasticGrowth(ledger, self._preemption, self._defragmentation)
        self._upgrades = Upgrades(ledger, self._defragmentation) if options.upgrades else None
        self._diagnosis = Diagnosis(ledger, self._admission)

    @property
    def instance(self) -> Instance:
        return self._ledger.instance

    @property
    def state(self) -> ClusterState:
        return self._ledger.state

    @property
    def compat(self) -> Compatibility:
        return self._ledger.compat

    @property
    def result(self) -> GreedyResult:
        return self._ledger.result

    @property
    def elastic_targets(self) -> Mapping[str, int]:
        return self._ledger.elastic_targets

    def run(self) -> GreedyResult:
        ledger = self._ledger
        instance = ledger.instance
        keys = sort_key(instance, ledger.options.order)
        queue = sorted(
            (j for j in instance.jobs if not j.is_elastic and not j.is_running),
            key=lambda j: keys[j.id],
        )
        self._elastic.scale_down()
        # Jobs past their max queue wait go before everything else, services included.
        overdue = [job for job in queue if job.id in ledger.overdue]
        if overdue:
            self._admission.place_queue(overdue)
        self._elastic.grow()
        if ledger.options.lookahead:
            self._lookahead.reserve()
        self._admission.place_queue([job for job in queue if job.id not in ledger.state.placement])
        if self._upgrades is not None:
            self._upgrade(queue)
        self._diagnosis.diagnose(queue)
        return ledger.result

    def _upgrade(self, queue: list[Job]) -> None:
        """Upgrades (``solver.greedy.upgrades``), then the queue once more onto the GPUs
        they left, without moving or stopping anything more."""
        assert self._upgrades is not None
        admission = self._admission
        blocked, _, shadow_nodes = admission.blocked
        if not self._upgrades.run(set(shadow_nodes) if blocked is not None else set()):
            return
        ledger = self._ledger
        left = [job for job in queue if job.id not in ledger.state.placement]
        if not left:
            return
        may = admission.may_migrate, admission.may_preempt
        admission.may_migrate = admission.may_preempt = False
        ledger.epoch += 1  # what failed before the upgrades may fit now
        for job in left:
            ledger.result.pending.pop(job.id, None)  # said again by this pass or diagnosis
        admission.place_queue(left)
        admission.may_migrate, admission.may_preempt = may

    # -- the CP-SAT pass's face ------------------------------------------------------

    def rebase(self) -> Rebase:
        """Turn the state into the CP-SAT pass's base: keep the greedy's disruptive
        decisions (resizes down, migrations, preemptions), undo its new starts and
        scale-ups — but for the jobs and services those migrations and preemptions made
        room for, which keep the room (so that "stopped for X" stays true whichever plan
        wins)."""
        ledger = self._ledger
        state = ledger.state
        jobs = ledger.instance.jobs
        room_made: dict[str, set[int]] = {}
        for beneficiary, names in ledger.made_room_for.values():
            room_made.setdefault(beneficiary, set()).update(state.node_index[n] for n in names)
        new_starts = [
            j
            for j in jobs
            if not j.is_elastic
            and not j.is_running
            and j.id in state.placement
            and j.id not in room_made
        ]
        starts = {j.id: dict(state.held(j.id)) for j in new_starts}
        for job in new_starts:
            state.evict(job)
        scale_ups: dict[str, dict[int, int]] = {}
        missing: dict[str, int] = {}
        for job in jobs:
            if not job.is_elastic:
                continue
            base = ledger.after_scale_down[job.id]
            added: dict[int, int] = {}
            for node, gpus in list(state.held(job.id).items()):
                extra = gpus - base.get(node, 0)
                if extra > 0 and node not in room_made.get(job.id, ()):
                    state.remove(job, node, extra)
                    added[node] = extra
            scale_ups[job.id] = added
            replicas = ledger.replicas(job)
            if ledger.elastic_targets[job.id] > replicas:
                missing[job.id] = ledger.elastic_targets[job.id] - replicas
        return Rebase(starts=starts, scale_ups=scale_ups, missing=missing)

    @property
    def reservations(self) -> Sequence[Reservation]:
        return self._lookahead.reservations

    def reservation_indices(self, job: Job) -> tuple[int, ...]:
        """Indices in ``reservations`` of those ``job`` must leave alone."""
        relevant = {id(r) for r in self._lookahead.reservations_for(job)}
        return tuple(i for i, r in enumerate(self._lookahead.reservations) if id(r) in relevant)

    def team_min_start(self) -> dict[str, int]:
        """GPUs each team must start on the base state so that the work the greedy
        stopped stays within what the team had borrowed (its guarantee holds), less what
        the base already starts for it."""
        ledger = self._ledger
        instance = ledger.instance
        pinned_by_team: dict[str, int] = {}
        for job in instance.jobs:
            if not job.is_elastic and not job.is_running and job.id in ledger.state.placement:
                pinned_by_team[job.team] = pinned_by_team.get(job.team, 0) + job.total_gpus
        team_min_start: dict[str, int] = {}
        for team, stopped in ledger.stopped_by_team.items():
            rule = instance.policy_by_team.get(team)
            guaranteed = rule.guaranteed_gpus if rule is not None else 0
            minimum = stopped - max(0, ledger.usage_before.get(team, 0) - guaranteed)
            minimum -= pinned_by_team.get(team, 0)
            if minimum > 0:
                team_min_start[team] = minimum
        return team_min_start

    @property
    def migrations_left(self) -> int:
        """What the greedy's moves left of the per-cycle migration budget (may be < 0)."""
        return self._ledger.config.max_migrations_per_cycle - self._ledger.migrations

    def may_move(self, job_id: str) -> bool:
        """Whether the job may still migrate this cycle."""
        return self._defragmentation.may_move(job_id)

    def move(self, job: Job, node: int, why: str) -> None:
        """Place an evicted ``job`` on ``node`` as a migration, explained by ``why``."""
        ledger = self._ledger
        ledger.state.place(job, {node: job.total_gpus})
        ledger.migrations += 1
        ledger.touch(job.id)
        ledger.result.decisions[job.id] = Reason(code=ReasonCode.defragmentation, message=why)

    def admit(self, job: Job, placement: dict[int, int]) -> None:
        """Start a pending block job on ``placement``; ``fill`` gives its reason."""
        ledger = self._ledger
        ledger.state.place(job, placement)
        ledger.touch(job.id)
        ledger.count_started(job.team, job.total_gpus)

    def fill(self, queue: list[Job], missing: Mapping[str, int]) -> None:
        """After the model's solution is placed: services still short grow into free GPUs,
        pending jobs of ``queue`` are admitted into what is left (without moving or
        stopping anything more), and every job of ``queue`` gets its reason again."""
        ledger = self._ledger
        admission = self._admission
        admission.may_migrate = admission.may_preempt = False
        ledger.epoch += 1
        admission.failed.clear()
        instance = ledger.instance
        result = ledger.result
        for job_id in sorted(missing):
            job = instance.job_by_id[job_id]
            short = ledger.elastic_targets[job_id] - ledger.replicas(job)
            if short > 0:
                self._elastic.scale_up(job, short)
            self._elastic.record(job)
        for job in queue:
            result.decisions.pop(job.id, None)
            result.pending.pop(job.id, None)
        rest = [job for job in queue if job.id not in ledger.state.placement]
        admission.place_queue(rest)
        for job in queue:
            held = ledger.state.placement.get(job.id)
            if held and job.id not in result.decisions:
                code = ReasonCode.overdue if instance.is_overdue(job) else ReasonCode.placed
                result.decisions[job.id] = Reason(
                    code=code, message=ledger.placed_message(job, held)
                )
        self._diagnosis.diagnose(queue)

    def broken_promise(self, target: dict[str, dict[str, int]]) -> str | None:
        """Why a plan with placement ``target`` would break what the greedy decided for
        a job, or None: room it made by moving or stopping work left to others (the
        moves and stops would be for nothing, under a reason that is not true), or a
        start on the GPUs reserved for a starving job (the model has no per-node
        reservation)."""
        return self._room_left_unused(target) or self._breaks_reservation(target)

    def _room_left_unused(self, target: dict[str, dict[str, int]]) -> str | None:
        for job_id, (beneficiary, nodes) in sorted(self._ledger.made_room_for.items()):
            if not nodes & set(target.get(beneficiary, {})):
                return f"{job_id} made room on {', '.join(sorted(nodes))} for {beneficiary}"
        return None

    def _breaks_reservation(self, target: dict[str, dict[str, int]]) -> str | None:
        """A new start on the GPUs reserved for a starving job that would still run at
        the reservation's time, or None."""
        guarded = self._admission.guarded
        if guarded is None:
            return None
        instance = self._ledger.instance
        _, shadow_time, shadow_nodes = self._admission.blocked
        reserved = {instance.nodes[n].name for n in shadow_nodes}
        for job_id, held in target.items():
            job = instance.job_by_id[job_id]
            if job.is_running or job.is_elastic or job_id == guarded.id:
                continue
            runtime = job.expected_runtime_s
            if runtime is not None and instance.now + runtime <= shadow_time:
                continue
            if reserved & set(held):
                return f"{job_id} starts on GPUs reserved for {guarded.id}"
        return None


def run_greedy(
    instance: Instance, options: GreedyOptions, compat: Compatibility | None = None
) -> GreedyResult:
    return GreedyEngine(instance, options, compat).run()


def greedy_plan(instance: Instance, options: GreedyOptions, *, policy: str) -> Plan:
    """The plan of one greedy pass: what the FIFO, backfill and priority policies return
    (fractional jobs placed around it: ``solver.greedy.sharing``; elastic training jobs
    at the size they hold or ask: ``solver.elastic_training.rigid``)."""
    return plan_with_shares(
        instance, lambda whole: _greedy_plan(rigid(whole), options, policy=policy)
    )


def _greedy_plan(instance: Instance, options: GreedyOptions, *, policy: str) -> Plan:
    started = time.perf_counter()
    result = run_greedy(instance, options)
    stats = SolveStats(
        status=SolveStatus.heuristic,
        engine=options.engine,
        wall_time_s=time.perf_counter() - started,
    )
    plan = build_plan(
        instance,
        policy=policy,
        target=result.target(),
        decisions=result.decisions,
        pending=result.pending,
        stats=stats,
    )
    plan.stats.wall_time_s = time.perf_counter() - started
    return plan
