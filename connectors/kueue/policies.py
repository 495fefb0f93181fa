"""Kueue ClusterQueues → a Shaper SLA policy spec (``import-policies``, connectors.import_policies).

A pure translation of ClusterQueue objects as the API serves them
(``kueue.x-k8s.io/v1beta2``) into the ``spec`` of ``POST /api/v1/policies``: one team per
ClusterQueue, named like it — the team the Kueue connector reports a Workload's job under
(connectors.kueue.workloads), so the imported terms apply to that queue's jobs.

* ``metadata.name`` → ``team``;
* Σ ``nominalQuota`` of ``nvidia.com/gpu`` over ``spec.resourceGroups[].flavors[]`` →
  ``guaranteed_gpus`` (floored to whole GPUs);
* ``borrowing_limit_gpus``: no ``spec.cohortName`` (Kueue: the queue cannot borrow) → 0;
  a cohort and a ``borrowingLimit`` on every GPU flavor → their Σ; a cohort and a GPU
  flavor without one (Kueue: unlimited within the cohort) → ``null`` (Shaper: unlimited,
  i.e. up to every idle GPU of the cluster);
* ``spec.fairSharing.weight`` (default 1) → ``priority_weight``, clamped to 0.001 … 1000
  (Kueue's weight 0, "always last", becomes 0.001);
* ``preemptible``: true when Kueue can preempt the queue's workloads — its own
  ``preemption.withinClusterQueue`` is not Never (its higher-priority work preempts it),
  or another queue of its cohort has ``reclaimWithinCohort`` or
  ``borrowWithinCohort.policy`` not Never; else false (Kueue never preempts them, so
  neither may Shaper).

Shaper has no cohorts: all teams of a cluster's policy share the cluster, so a borrowing
team borrows from every other team's idle GPUs, not from its cohort's only. Unlimited
borrowing within a cohort therefore becomes unlimited borrowing within the cluster (bounded,
as in Kueue, by what is idle), and ClusterQueues of different cohorts imported into one
policy borrow from each other in Shaper (a note says so).

Not mapped (a note per ClusterQueue where it is set): ``lendingLimit`` (Shaper lends all
idle GPUs above the guarantee), hierarchical cohorts (``Cohort`` objects, their quotas and
``parentName``), quotas of other resources (CPU, memory, other accelerators), flavor
fungibility and per-flavor quotas (Shaper counts a team's GPUs over all models),
``queueingStrategy``, ``admissionChecks``, ``stopPolicy``, ``namespaceSelector``,
``maxPriorityThreshold``, and the Workload priorities (WorkloadPriorityClasses), which
reach Shaper per job (``priority``) rather than per team. Fields Shaper has and Kueue
does not (``max_queue_wait_s``, ``max_migrations_per_day``, ``deadline``,
``allowed_clusters``, ``cluster_selector``) get Shaper's defaults here;
connectors.import_policies keeps an operator's values of them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from connectors.kubernetes.nodes import GPU_RESOURCE

Object = Mapping[str, Any]

# SlaPolicySpec's bounds (app/policies/models.py, not imported: connectors never import app).
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0
MAX_GPUS = 1_000_000
DEFAULT_MAX_MIGRATIONS_PER_DAY = 4
# Fields of a team that Kueue has no notion of: an import keeps an operator's values.
SHAPER_ONLY_FIELDS = (
    "max_queue_wait_s",
    "max_migrations_per_day",
    "deadline",
    "allowed_clusters",
    "cluster_selector",
)
NEVER = "Never"


@dataclass(frozen=True)
class ImportedPolicy:
    """The spec, and what of the ClusterQueues it could not express."""

    spec: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def teams(self) -> list[str]:
        return [str(team["team"]) for team in self.spec["teams"]]


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("8", 8, "1.5", "500m", "2k") as a number."""
    return Decimal(parse_quantity(value))


def _spec(cluster_queue: Object) -> Object:
    return cluster_queue.get("spec") or {}


def _gpu_entries(cluster_queue: Object) -> list[Object]:
    """The ``nvidia.com/gpu`` entries of every flavor of every resource group."""
    return [
        resource
        for group in _spec(cluster_queue).get("resourceGroups") or []
        for flavor in group.get("flavors") or []
        for resource in flavor.get("resources") or []
        if resource.get("name") == GPU_RESOURCE
    ]


def _gpus(total: Decimal) -> int:
    return min(MAX_GPUS, max(0, math.floor(total)))


def _preempts_own(cluster_queue: Object) -> bool:
    preemption = _spec(cluster_queue).get("preemption") or {}
    return str(preemption.get("withinClusterQueue") or NEVER) != NEVER


def _preempts_cohort(cluster_queue: Object) -> bool:
    preemption = _spec(cluster_queue).get("preemption") or {}
    borrow = preemption.get("borrowWithinCohort") or {}
    return (
        str(preemption.get("reclaimWithinCohort") or NEVER) != NEVER
        or str(borrow.get("policy") or NEVER) != NEVER
    )


def team_policy(
    cluster_queue: Object, peers: Iterable[Object] = ()
) -> tuple[dict[str, Any], list[str]]:
    """One ClusterQueue's team terms, given the other ClusterQueues (``peers``: those of
    its cohort decide whether its workloads can be preempted); and its notes."""
    name = str(cluster_queue["metadata"]["name"])
    spec = _spec(cluster_queue)
    notes: list[str] = []
    entries = _gpu_entries(cluster_queue)

    nominal = sum((quantity(e.get("nominalQuota", 0)) for e in entries), Decimal(0))
    guaranteed = _gpus(nominal)
    if guaranteed != nominal:
        notes.append(f"{name}: GPU nominalQuota {nominal} rounded to {guaranteed}")

    cohort = spec.get("cohortName") or spec.get("cohort")  # v1beta1 spelled it cohort
    borrowing: int | None
    if not cohort or not entries:
        borrowing = 0  # Kueue: no cohort, or no GPU quota listed → cannot borrow GPUs
    elif any(e.get("borrowingLimit") is None for e in entries):
        borrowing = None
    else:
        borrowing = _gpus(sum((quantity(e["borrowingLimit"]) for e in entries), Decimal(0)))
    if any(e.get("lendingLimit") is not None for e in entries):
        notes.append(f"{name}: lendingLimit not mapped (Shaper lends all idle GPUs)")

    weight_value = (spec.get("fairSharing") or {}).get("weight")
    weight = float(quantity(weight_value)) if weight_value is not None else 1.0
    clamped = min(MAX_WEIGHT, max(MIN_WEIGHT, weight))
    if clamped != weight:
        notes.append(f"{name}: fairSharing weight {weight_value} clamped to {clamped:g}")

    cohort_peers = [
        p
        for p in peers
        if p["metadata"]["name"] != name
        and cohort
        and (_spec(p).get("cohortName") or _spec(p).get("cohort")) == cohort
    ]
    preemptible = _preempts_own(cluster_queue) or any(_preempts_cohort(p) for p in cohort_peers)

    threshold = ((spec.get("preemption") or {}).get("borrowWithinCohort") or {}).get(
        "maxPriorityThreshold"
    )
    if threshold is not None:
        notes.append(f"{name}: borrowWithinCohort.maxPriorityThreshold not mapped")
    team = {
        "team": name,
        "priority_weight": clamped,
        "guaranteed_gpus": guaranteed,
        "borrowing_limit_gpus": borrowing,
        "max_queue_wait_s": None,
        "preemptible": preemptible,
        "max_migrations_per_day": DEFAULT_MAX_MIGRATIONS_PER_DAY,
        "deadline": None,
        "allowed_clusters": None,
        "cluster_selector": None,
    }
    return team, notes


def import_cluster_queues(
    cluster_queues: Iterable[Object], *, only: Collection[str] | None = None
) -> ImportedPolicy:
    """ClusterQueues → an SLA policy spec (teams sorted by name, no services) and notes.

    ``only``: import these ClusterQueues; the others still count as cohort peers (whether
    a queue's workloads can be preempted depends on its cohort's other queues)."""
    everything = list(cluster_queues)
    chosen = [cq for cq in everything if only is None or cq["metadata"]["name"] in set(only)]
    teams: list[dict[str, Any]] = []
    notes: list[str] = []
    for cluster_queue in sorted(chosen, key=lambda cq: str(cq["metadata"]["name"])):
        team, team_notes = team_policy(cluster_queue, everything)
        teams.append(team)
        notes.extend(team_notes)
    cohorts = {_spec(cq).get("cohortName") or _spec(cq).get("cohort") or None for cq in chosen} - {
        None
    }
    if len(cohorts) > 1:
        notes.append(
            f"cohorts {', '.join(sorted(str(c) for c in cohorts))} become one: Shaper's teams "
            "of a cluster all borrow from each other"
        )
    return ImportedPolicy(spec={"teams": teams, "services": []}, notes=notes)


def policy_spec(
    cluster_queues: Iterable[Object], *, only: Collection[str] | None = None
) -> dict[str, Any]:
    """ClusterQueues → the SLA policy spec dict (see the module's mapping table)."""
    return import_cluster_queues(cluster_queues, only=only).spec


def merged_spec(
    current: Mapping[str, Any] | None, imported: Mapping[str, Any], *, replace: bool = False
) -> dict[str, Any]:
    """The policy's next spec: the imported teams' Kueue terms over ``current``.

    Kept from ``current`` unless ``replace``: its services, its speed profiles (and any
    other section Kueue has no word for), its teams that no ClusterQueue names, and each
    imported team's Shaper-only fields (``max_queue_wait_s``, ``max_migrations_per_day``,
    ``deadline``, ``allowed_clusters``, ``cluster_selector``). Teams keep their order; new
    ones follow, sorted — so importing the same queues again gives the same spec."""
    imported_teams = {str(t["team"]): dict(t) for t in imported["teams"]}
    if current is None or replace:
        return {"teams": list(imported_teams.values()), "services": list(imported["services"])}
    others = {k: v for k, v in current.items() if k not in ("teams", "services")}
    teams: list[dict[str, Any]] = []
    for team in current.get("teams", []):
        name = str(team["team"])
        if name in imported_teams:
            fresh = imported_teams.pop(name)
            teams.append({**fresh, **{k: team[k] for k in SHAPER_ONLY_FIELDS if k in team}})
        else:
            teams.append(dict(team))
    teams.extend(imported_teams.values())
    return {"teams": teams, "services": list(current.get("services", [])), **others}
