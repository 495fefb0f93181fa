"""Small builders for hand-made solver instances."""

from __future__ import annotations

from typing import Any

# The GPU models and the clock are the property tests' distribution's, so hand-made and
# random instances share them.
from bench.instances.every_rule import MODELS, NOW
from solver.actions import build_plan
from solver.instance import Instance, Job, JobShape, Node, SlaPolicy, SolverConfig
from solver.plan import Plan, SolveStats
from solver.policies import get_policy
from solver.validate import check

FAST = SolverConfig(time_limit_s=5.0, num_workers=1, deterministic=True)


def node(name: str, gpus: int = 8, model: str = "a100", cluster: str = "c1", **kw: Any) -> Node:
    return Node(name=name, cluster=cluster, gpu_model=model, gpus=gpus, **kw)


def job(job_id: str, gpus: int = 1, replicas: int = 1, **kw: Any) -> Job:
    kw.setdefault("submit_time", NOW - 60)
    return Job(id=job_id, gpus_per_replica=gpus, replicas=replicas, **kw)


def running(job_id: str, placement: dict[str, int], gpus: int | None = None, **kw: Any) -> Job:
    per_replica = gpus if gpus is not None else sum(placement.values())
    replicas = sum(placement.values()) // per_replica
    kw.setdefault("start_time", NOW - 3600)
    kw.setdefault("submit_time", NOW - 7200)
    return Job(
        id=job_id, gpus_per_replica=per_replica, replicas=replicas, placement=placement, **kw
    )


def service(
    job_id: str,
    forecast: tuple[int, ...],
    placement: dict[str, int] | None = None,
    gpus: int = 1,
    **kw: Any,
) -> Job:
    placement = placement or {}
    kw.setdefault("min_replicas", 0)
    kw.setdefault("max_replicas", 16)
    return Job(
        id=job_id,
        shape=JobShape.elastic,
        gpus_per_replica=gpus,
        replicas=sum(placement.values()) // gpus,
        placement=placement,
        forecast=forecast,
        **kw,
    )


def instance(
    nodes: list[Node],
    jobs: list[Job],
    policies: tuple[SlaPolicy, ...] = (),
    config: SolverConfig = FAST,
    **kw: Any,
) -> Instance:
    return Instance(
        now=NOW,
        gpu_models=MODELS,
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        policies=policies,
        config=config,
        **kw,
    )


def plan_with(policy: str, inst: Instance) -> Plan:
    """Plan with a policy and check it against every hard constraint."""
    plan = get_policy(policy).plan(inst)
    check(inst, plan)
    return plan


def plan_from(inst: Instance, target: dict[str, dict[str, int]]) -> Plan:
    """A hand-made plan reaching ``target``, with consistent actions and default reasons."""
    return build_plan(
        inst, policy="hand", target=target, decisions={}, pending={}, stats=SolveStats()
    )
