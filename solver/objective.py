"""The objective every engine maximises, evaluated on a finished target placement.

Units: one *unit* is one reference GPU (speed 1.0) of priority weight 1 held for
``config.value_horizon_s`` seconds (default one hour). With ``w(j)`` the job's weight
(team ``priority_weight`` × job ``priority``) and ``s(n)`` the speed of node n's model::

    objective =   Σ_block placed j   w(j) · boost(j) · Σ_n gpus(j, n) · s(j, n)
                + Σ_elastic e        w(e) · gpus_per_replica · Σ_fastest served(e) replicas s(n)
                − elastic_unmet_weight · Σ_e w(e) · gpus_per_replica · unmet(e)
                − Σ_migrated j       w(j) · gpus(j) · migration_seconds(j) / value_horizon_s
                − Σ_started away j   w(j) · gpus(j) · remote_start_seconds(j) / value_horizon_s
                − Σ_stopped j        w(j) · gpus(j) · lost_work_seconds(j) / value_horizon_s
                + fragmentation_weight · (ready nodes left with all GPUs free)

``s(j, n)`` is block job j's own speed on node n's model where it states one
(``Instance.speeds``, with ``config.job_speeds`` on; ``Instance.job_speed``), else ``s(n)``.
``unmet(e) = max(0, demand(e) − replicas(e))`` with ``demand(e)`` the forecast for now,
clamped to the service's min/max replicas. A migration to another cluster costs its
``migration_seconds(across=True)``; a pending job *started away* from its ``home_cluster``
pays the one transfer of its image there (both in ``ObjectiveTerms.migration``).
``boost(j)`` (``Instance.boost``) is
``overdue_weight`` for a pending job past its SLA's max queue wait, its aging credit
(1 + whole ``aging_s`` periods waited) for another pending job, and 1 for a running one; the
boost orders such jobs first, while
the rule that they are placed when they can be is hard (``solver.overdue_pass``,
``solver.validate`` rule 10). ``served(e) = min(replicas, demand now)``: replicas above
demand are reserve, not output. The *priority-weighted allocation* reported by the
benchmark is the first two lines without the boost.

The CP-SAT model (``solver.model`` and its ``solver.constraints``) uses these terms with
integer coefficients: each scaled by ``SCALE`` and rounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from solver.instance import Instance, Job, Node, NodeState

SCALE = 1000  # objective units -> CP-SAT's integer coefficients


@dataclass(frozen=True)
class ObjectiveTerms:
    allocation: float
    boosted_allocation: float
    elastic_unmet: float
    migration: float
    preemption: float
    whole_free_nodes: int
    objective: float


def elastic_demand(job: Job) -> int:
    return job.demand_at(0)


def _cluster_of(placement: dict[str, int], node_by_name: dict[str, Node]) -> str:
    """A block job's cluster (a gang never spans clusters: ``solver.validate``)."""
    return node_by_name[next(iter(placement))].cluster


def evaluate(instance: Instance, placement: dict[str, dict[str, int]]) -> ObjectiveTerms:
    return Evaluator(instance).evaluate(placement)


class _JobTerms(NamedTuple):
    """What ``evaluate`` needs of one job that depends only on the instance."""

    job: Job
    weight: float
    elastic: bool
    boost: float  # block jobs only (1.0 for services, where it is not used)
    demand: int  # services only


class Evaluator:
    """``evaluate`` for several placements of one instance: weights, boosts, services'
    demand and node speeds are looked up once, not once per placement. The shaper scores
    three placements of one instance per plan (the greedy's, the CP-SAT base, CP-SAT's);
    at 100,000 GPUs and 80,000 jobs those lookups were half of each evaluation. The sums
    run in the same order as ever, so the terms are the same to the last bit."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        speed_by_model = {model.name: model.speed for model in instance.gpu_models}
        self.node_by_name = node_by_name = instance.node_by_name
        self.speed = {name: speed_by_model[node.gpu_model] for name, node in node_by_name.items()}
        # The nodes that count as whole free nodes when a placement leaves them empty.
        self.countable = [
            name
            for name, node in node_by_name.items()
            if node.state is NodeState.up and node.gpus > 0
        ]
        self.jobs: list[_JobTerms] = []
        for job in instance.jobs:
            weight = instance.weight(job)
            if job.is_elastic:
                self.jobs.append(_JobTerms(job, weight, True, 1.0, elastic_demand(job)))
            else:
                self.jobs.append(_JobTerms(job, weight, False, instance.boost(job), 0))

    def evaluate(self, placement: dict[str, dict[str, int]]) -> ObjectiveTerms:
        instance = self.instance
        config = instance.config
        node_by_name = self.node_by_name
        speed = self.speed
        used = dict.fromkeys(node_by_name, 0)
        allocation = boosted = unmet = migration = preemption = 0.0
        horizon = config.value_horizon_s
        for job, weight, elastic, boost, demand in self.jobs:
            target = placement.get(job.id, {})
            speed_gpus = 0.0
            gpus = 0
            own = instance.own_speeds(job) if instance.speeds else None
            for node_name, count in target.items():
                used[node_name] += count
                if own:
                    model = node_by_name[node_name].gpu_model
                    speed_gpus += count * own.get(model, speed[node_name])
                else:
                    speed_gpus += count * speed[node_name]
                gpus += count
            if elastic:
                replicas = gpus // job.gpus_per_replica
                served = min(replicas, demand)
                if served:
                    # The served replicas are the fastest ones; the rest is reserve.
                    speeds = sorted(
                        (
                            speed[node_name]
                            for node_name, count in target.items()
                            for _ in range(count // job.gpus_per_replica)
                        ),
                        reverse=True,
                    )
                    value = weight * job.gpus_per_replica * sum(speeds[:served])
                    allocation += value
                    boosted += value
                unmet += (
                    config.elastic_unmet_weight
                    * weight
                    * job.gpus_per_replica
                    * max(0, demand - replicas)
                )
                continue
            value = weight * speed_gpus
            allocation += value
            boosted += value * boost
            if not job.is_running and target and job.home_cluster is not None:
                if _cluster_of(target, node_by_name) != job.home_cluster:
                    migration += weight * gpus * instance.transfer_per_gpu(job)
            if job.is_running and target != job.placement:
                if target:
                    across = _cluster_of(target, node_by_name) != _cluster_of(
                        job.placement, node_by_name
                    )
                    seconds = instance.migration.migration_seconds(job, across=across)
                    migration += weight * job.held_gpus * seconds / horizon
                else:
                    seconds = instance.migration.preemption_lost_seconds(job, instance.now)
                    preemption += weight * job.held_gpus * seconds / horizon
        whole_free = sum(1 for name in self.countable if used[name] == 0)
        objective = (
            boosted - unmet - migration - preemption + config.fragmentation_weight * whole_free
        )
        return ObjectiveTerms(
            allocation=allocation,
            boosted_allocation=boosted,
            elastic_unmet=unmet,
            migration=migration,
            preemption=preemption,
            whole_free_nodes=whole_free,
            objective=objective,
        )
