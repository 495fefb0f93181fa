"""A job's data residency in the federated simulator (issue 16): a scenario gives its
clusters labels (``cluster_labels``) and a job a ``cluster_selector`` or
``allowed_clusters``; planned as one group, a job kept in its region waits at home while
the cluster of another region is idle, and a job without a home starts only where its
rule permits."""

from __future__ import annotations

from typing import Any

import pytest

from sim.metrics import summarize
from sim.run import simulate
from sim.scenario import build_workload

HOUR = 3600.0
FEDERATED = ["federated-fifo", "federated-priority", "federated-shaper"]


def _scenario(jobs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "name": "residency",
        "horizon_h": 24,
        "gpu_models": {"H100": {}},
        "cluster": [
            {"prefix": "ams", "count": 1, "gpus": 8, "model": "H100", "cluster": "ams"},
            {"prefix": "iad", "count": 1, "gpus": 8, "model": "H100", "cluster": "iad"},
        ],
        "cluster_labels": {"ams": {"region": "eu"}, "iad": {"region": "us"}},
        "transfer": {"inter_cluster_bandwidth_mib_per_s": 100, "inter_cluster_overhead_s": 120},
        "jobs": jobs,
        **extra,
    }


def _pair(**rule: Any) -> list[dict[str, Any]]:
    """Two 8-GPU jobs submitted to ams at once: one cluster holds one of them."""
    return [
        {"id": "long", "gpus": 8, "hours": 6, "cluster": "ams", **rule},
        {"id": "short", "gpus": 8, "hours": 1, "cluster": "ams", **rule},
    ]


@pytest.mark.parametrize("policy", FEDERATED)
@pytest.mark.parametrize(
    "rule", [{"cluster_selector": {"region": "eu"}}, {"allowed_clusters": ["ams"]}]
)
def test_jobs_kept_in_their_region_wait_at_home_beside_an_idle_cluster(
    policy: str, rule: dict[str, Any]
) -> None:
    sim = simulate(build_workload(_scenario(_pair(**rule))), policy, check_invariants=True)
    first, second = sorted(sim.jobs.values(), key=lambda s: s.first_start or 0.0)
    assert first.first_start == 0.0
    assert second.first_start == pytest.approx(first.end_time)  # waited; iad stayed idle
    assert {s.location for s in sim.jobs.values()} == {"ams"}
    assert summarize(sim).metrics["remote_starts"] == 0


@pytest.mark.parametrize("policy", FEDERATED)
def test_without_the_rule_one_of_them_starts_in_the_idle_cluster(policy: str) -> None:
    sim = simulate(build_workload(_scenario(_pair())), policy, check_invariants=True)
    assert sorted(s.location or "" for s in sim.jobs.values()) == ["ams", "iad"]
    assert summarize(sim).metrics["remote_starts"] == 1


def test_a_job_without_a_home_starts_only_where_its_rule_permits() -> None:
    # Still running at the horizon (48 h of work in 24 h), so its placement shows where.
    jobs = [{"id": "us-data", "gpus": 4, "hours": 48, "cluster_selector": {"region": "us"}}]
    for region, node in (("us", "iad-0"), ("eu", "ams-0")):
        jobs[0]["cluster_selector"] = {"region": region}
        sim = simulate(
            build_workload(_scenario(jobs)), "federated-shaper", check_invariants=True, drain=False
        )
        assert set(sim.jobs["us-data"].placement) == {node}


def test_a_generated_stream_carries_its_rule_to_every_job() -> None:
    generate = {
        "cluster": "ams",
        "cluster_selector": {"region": "eu"},
        "count": 3,
        "mix": [{"gpus": 8, "hours": 1}],
    }
    workload = build_workload(_scenario([], generate=generate))
    assert {job.cluster_selector for job in workload.jobs} == {(("region", "eu"),)}
    sim = simulate(workload, "federated-shaper", check_invariants=True)
    assert {s.location for s in sim.jobs.values()} == {"ams"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cluster_labels": {"fra": {"region": "eu"}}}, "cluster_labels of fra: cluster 'fra'"),
        (
            {"jobs": [{"id": "j", "gpus": 1, "hours": 1, "allowed_clusters": ["fra"]}]},
            "j: cluster 'fra' has no nodes",
        ),
    ],
)
def test_a_rule_naming_a_cluster_without_nodes_is_refused(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_workload({**_scenario([]), **change})
