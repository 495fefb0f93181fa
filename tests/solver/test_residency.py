"""A job's own data residency in a federation group (issue 16): the clusters it may start
in are those every rule that applies permits — its own ``Residency`` and its team's — by
labels and by name (``solver.federation.residency_clusters``); a job none of whose rules
permits another member stays home even when another member is idle."""

from __future__ import annotations

import pytest

from solver import Instance, SolverConfig
from solver.federation import Residency, cross_cluster_starts, federate, residency_clusters
from solver.instance import GpuModel, Job, MigrationCostModel, Node
from solver.policies import get_policy
from solver.validate import validate

H100 = GpuModel(name="H100", memory_mib=81920)
GROUP = SolverConfig(
    migration=False, cp_sat_migration=False, replica_moves=False, deterministic=True
)
LINK = MigrationCostModel(inter_cluster_bandwidth_mib_per_s=1000)
LABELS = {
    "ams": {"region": "eu", "site": "ams1"},
    "fra": {"region": "eu", "site": "fra1"},
    "iad": {"region": "us"},
}


@pytest.mark.parametrize(
    ("rules", "clusters"),
    [
        ((), {"ams", "fra", "iad"}),
        ((None,), {"ams", "fra", "iad"}),
        ((Residency(),), {"ams", "fra", "iad"}),
        ((Residency(cluster_selector={"region": "eu"}),), {"ams", "fra"}),
        ((Residency(cluster_selector={"region": "eu", "site": "fra1"}),), {"fra"}),
        ((Residency(cluster_selector={"region": "apac"}),), set()),
        ((Residency(cluster_selector={"zone": ""}),), set()),  # absent is not empty
        ((Residency(allowed_clusters=frozenset({"ams", "iad"})),), {"ams", "iad"}),
        ((Residency(allowed_clusters=frozenset()),), set()),
        # The job's own rule and its team's: both must permit the cluster.
        (
            (
                Residency(cluster_selector={"region": "eu"}),
                Residency(allowed_clusters=frozenset({"fra", "iad"})),
            ),
            {"fra"},
        ),
        (
            (
                Residency(cluster_selector={"region": "us"}),
                Residency(cluster_selector={"region": "eu"}),
            ),
            set(),
        ),
    ],
)
def test_a_cluster_must_satisfy_every_rule(
    rules: tuple[Residency | None, ...], clusters: set[str]
) -> None:
    assert residency_clusters(LABELS, *rules) == clusters


def _group(waiting: list[Job], own: dict[str, Residency]) -> Instance:
    """ams is full (a running 8-GPU job) with ``waiting`` queued there; iad (us) is idle.
    Each waiting job may start in the members its residency permits (no rule: any)."""
    busy = Job(
        id="ams/busy", replicas=8, placement={"ams/a0": 8}, start_time=-60.0, preemptible=False
    )
    parts = {
        "ams": Instance(
            gpu_models=(H100,),
            nodes=(Node(name="ams/a0", cluster="ams", gpu_model="H100", gpus=8),),
            jobs=(busy, *waiting),
            config=GROUP,
        ),
        "iad": Instance(
            gpu_models=(H100,),
            nodes=(Node(name="iad/i0", cluster="iad", gpu_model="H100", gpus=8),),
            config=GROUP,
        ),
    }
    others = {"iad": LABELS["iad"]}
    movable = {
        job.id: residency_clusters(others, own.get(job.id))
        for job in waiting
        if residency_clusters(others, own.get(job.id))
    }
    return federate(parts, movable=movable, migration=LINK, config=GROUP)


def test_a_job_kept_in_its_region_waits_while_a_cluster_elsewhere_is_idle() -> None:
    eu = Job(id="ams/eu-data", replicas=4, submit_time=-7200.0, priority=5.0)
    free = Job(id="ams/anywhere", replicas=4, submit_time=-60.0, priority=1.0)
    whole = _group([eu, free], {"ams/eu-data": Residency(cluster_selector={"region": "eu"})})
    assert whole.job_by_id["ams/eu-data"].clusters == frozenset({"ams"})
    plan = get_policy("shaper").plan(whole)
    assert validate(whole, plan) == []
    starts = {s.job_id: s.target for s in cross_cluster_starts(whole, plan)}
    # The older, higher-priority job stays queued at home; the one without a rule goes.
    assert starts == {"ams/anywhere": "iad"}
    assert "ams/eu-data" not in plan.placement


def test_the_same_job_without_its_rule_goes_to_the_idle_cluster() -> None:
    eu = Job(id="ams/eu-data", replicas=4, submit_time=-7200.0, priority=5.0)
    whole = _group([eu], {})
    plan = get_policy("shaper").plan(whole)
    assert {s.job_id: s.target for s in cross_cluster_starts(whole, plan)} == {"ams/eu-data": "iad"}
