"""The bookkeeping one greedy pass shares between its phases.

Every phase (``admission``, ``elastic``, ``preemption``, ``defragmentation``,
``lookahead``, ``diagnosis``) changes the same cluster state and reads the same budgets,
guarantees and reasons, so they live here once rather than as attributes of one large
engine: the cluster state, the plan's reasons so far, the per-team starts and stops the
guarantees count, the disruption counters the per-cycle budgets count, and the jobs this
cycle touched (a touched job is not moved or stopped again in the same cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from solver.compat import Compatibility
from solver.gang_fit import GangFit
from solver.greedy.options import GreedyOptions
from solver.instance import Instance, Job
from solver.plan import Reason, ReasonCode
from solver.state import ClusterState


@dataclass
class GreedyResult:
    instance: Instance
    state: ClusterState
    decisions: dict[str, Reason] = field(default_factory=dict)
    pending: dict[str, Reason] = field(default_factory=dict)

    def target(self) -> dict[str, dict[str, int]]:
        names = [node.name for node in self.instance.nodes]
        return {
            job_id: {names[node]: gpus for node, gpus in held.items()}
            for job_id, held in self.state.placement.items()
            if held
        }


class Ledger:
    def __init__(
        self, instance: Instance, options: GreedyOptions, compat: Compatibility | None
    ) -> None:
        self.instance = instance
        self.options = options
        self.config = instance.config
        self.state = ClusterState(instance, compat)
        if options.job_speeds and instance.config.job_speeds:
            self.state.speeds = instance.speeds
        self.compat = self.state.compat
        if options.gang_aware:
            self.state.gang_fit = GangFit(instance, self.compat)
        self.result = GreedyResult(instance=instance, state=self.state)
        self.weight = {job.id: instance.weight(job) for job in instance.jobs}
        self.overdue = set(instance.overdue_ids)  # Instance.is_overdue of its own jobs
        # Guarantees: a team's borrowed GPUs before the cycle, and what it starts and stops.
        self.usage_before = dict(self.state.team_usage)
        self.started_by_team: dict[str, int] = {}
        self.stopped_by_team: dict[str, int] = {}
        # Per-cycle disruption budgets.
        self.migrations = 0
        self.preemptions = 0
        self.touched: set[str] = set()  # started, moved or stopped this cycle
        self.touched_log: list[str] = []  # the same, in the order they were touched
        # Job moved or stopped -> (the job it made room for, the nodes it left for it).
        self.made_room_for: dict[str, tuple[str, frozenset[str]]] = {}
        self.room_made_for: set[str] = set()  # the jobs of made_room_for's values
        # Bumped whenever room may have appeared: failure caches keyed by it go stale.
        self.epoch = 0
        # Service -> replicas it should have now, and what it held after scaling down.
        self.elastic_targets: dict[str, int] = {}
        self.after_scale_down: dict[str, dict[int, int]] = {}
        # Why pending jobs stay pending, noted where it is known, read by the diagnosis.
        self.forecast_blocked: set[str] = set()
        self.budget_blocked: set[str] = set()
        self.not_worth: dict[str, str] = {}  # job -> why no preemption for it paid off

    def touch(self, job_id: str) -> None:
        """Record that this cycle started, moved or stopped ``job_id``."""
        if job_id not in self.touched:
            self.touched.add(job_id)
            self.touched_log.append(job_id)

    def made_room(self, moved: str, beneficiary: str, nodes: frozenset[str]) -> None:
        """Record that ``moved`` was moved or stopped to make room for ``beneficiary``
        on ``nodes``."""
        self.made_room_for[moved] = (beneficiary, nodes)
        self.room_made_for.add(beneficiary)

    def replicas(self, job: Job) -> int:
        return sum(self.state.held(job.id).values()) // job.gpus_per_replica

    def count_started(self, team: str, gpus: int) -> None:
        self.started_by_team[team] = self.started_by_team.get(team, 0) + gpus

    def reclaimable(self, team: str, extra_started: int) -> int:
        """GPUs of ``team`` that may still be stopped without taking it below its
        guarantee: what it borrowed before the cycle and started since, less what was
        stopped already."""
        policy = self.instance.policy_by_team.get(team)
        guaranteed = policy.guaranteed_gpus if policy is not None else 0
        return (
            max(0, self.usage_before.get(team, 0) - guaranteed)
            + self.started_by_team.get(team, 0)
            + extra_started
            - self.stopped_by_team.get(team, 0)
        )

    def note_stopped(self, victims: Iterable[Job], why: Callable[[Job], str]) -> None:
        """Count and explain the jobs a decision stops."""
        for victim in victims:
            self.preemptions += 1
            self.touch(victim.id)
            self.result.decisions[victim.id] = Reason(
                code=ReasonCode.preempted_by_higher_priority, message=why(victim)
            )

    def node_speed(self, node: int) -> float:
        return self.compat.groups[self.compat.group_of_node[node]].gpu_model.speed

    def job_speed(self, job: Job, node: int) -> float:
        """How fast ``job`` runs on ``node`` as the plan counts it: its own speed there
        (``Instance.job_speed``) with ``options.job_speeds``, else the model's."""
        return self.state.group_speed(self.compat.group_of_node[node], job)

    def failure_key(self, job: Job, extra: object) -> tuple[object, ...]:
        """Jobs of the same shape, groups and own speeds fail alike: caches of failed
        attempts use it (a start's worth, and so whether a stop or a move pays for it, is
        counted at the job's own speed)."""
        own = self.state.own_speeds(job)
        return (
            tuple(self.compat.groups_for(job)),
            job.replicas,
            job.gpus_per_replica,
            job.cpu_milli_per_replica,
            job.memory_mib_per_replica,
            job.max_nodes,
            tuple(sorted(own.items())) if own else None,
            job.id in self.instance.one_replica_per_node,  # spreads: fails where others fit
            extra,
        )

    def frozen_reason(self, job: Job) -> Reason:
        return Reason(code=ReasonCode.dwell, message=self.instance.frozen_because(job) or "frozen")

    def placed_message(self, job: Job, placement: dict[int, int]) -> str:
        names = ", ".join(
            f"{self.instance.nodes[n].name}:{g}" for n, g in sorted(placement.items())
        )
        if self.instance.is_overdue(job):
            return f"past its max queue wait; placed on {names}"
        return f"placed on {names}"
