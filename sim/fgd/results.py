"""What one inflation run yields, and how runs compare with the baselines.

The metric is the reference's (``experiments/analysis``, the FGD paper's Fig. 9a):
unallocated GPU capacity (in GPUs, counted in milli-GPUs) against the arrived GPU requests
in % of capacity; ``curve`` holds it at every integer percent. :func:`compare_to_baselines`
gives, per policy, the largest reduction against the best baseline *at the same arrival
ratio* over the curve (the paper's "up to 49 %" is over this curve; its end point, 130 %,
is where the reduction is largest in the reference's published results) besides the end
figure. The reference reports the median of ten seeds (42-51): :func:`spread_over_seeds`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.placement import BASELINES


@dataclass(slots=True)
class InflationResult:
    policy: str
    capacity_gpus: float
    arrived_gpus: float
    allocated_gpus: float
    unallocated_gpus: float
    whole_gpus_allocated: int
    fragmented_share: float
    pods_arrived: int
    pods_failed: int
    migrations: int = 0
    # (arrived requests / capacity, unallocated GPUs) at each integer percent of arrival.
    curve: list[tuple[float, float]] = field(default_factory=list)
    preempted: int = 0
    # Filled by ``compare_to_baselines``: the largest reduction in unallocated GPUs against
    # the best baseline at the same arrival ratio, and that ratio.
    best_reduction: float | None = None
    best_reduction_at: float | None = None
    cluster: Cluster | None = field(default=None, repr=False)

    def unallocated_at(self, ratio: float) -> float | None:
        """Unallocated GPUs on the curve at ``ratio`` (e.g. 1.0 = 100 %), if reached."""
        for r, value in self.curve:
            if abs(r - ratio) < 1e-9:
                return value
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity_gpus": self.capacity_gpus,
            "arrived_gpus": self.arrived_gpus,
            "allocated_gpus": self.allocated_gpus,
            "unallocated_gpus": self.unallocated_gpus,
            "whole_gpus_allocated": self.whole_gpus_allocated,
            "fragmented_share": self.fragmented_share,
            "pods_arrived": self.pods_arrived,
            "pods_failed": self.pods_failed,
            "migrations": self.migrations,
            "preempted": self.preempted,
            "best_reduction": self.best_reduction,
            "best_reduction_at": self.best_reduction_at,
            "curve": self.curve,
        }


def compare_to_baselines(
    results: Sequence[InflationResult], *, from_ratio: float = 0.75
) -> InflationResult | None:
    """Set ``best_reduction``/``best_reduction_at`` of every result against the best
    baseline among ``results`` at each arrival ratio of the curve (from ``from_ratio``, the
    left edge of the paper's Fig. 9a, where some GPUs are unallocated by every policy).
    Returns the best baseline at the end (fewest unallocated GPUs), or None without one."""
    baselines = [r for r in results if r.policy in BASELINES]
    if not baselines:
        return None
    best_at: dict[float, float] = {}
    for b in baselines:
        for ratio, value in b.curve:
            if ratio >= from_ratio - 1e-9:
                best_at[ratio] = min(best_at.get(ratio, np.inf), value)
    for r in results:
        best: tuple[float, float] | None = None
        for ratio, value in r.curve:
            base = best_at.get(ratio)
            if base is None or base <= 0:
                continue
            reduction = 1 - value / base
            if best is None or reduction > best[0]:
                best = (reduction, ratio)
        r.best_reduction, r.best_reduction_at = best if best else (None, None)
    return min(baselines, key=lambda r: r.unallocated_gpus)


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One policy over several seeds (the reference reports the median of seeds 42-51)."""

    policy: str
    seeds: int
    median_unallocated: float
    min_unallocated: float
    max_unallocated: float
    # 1 − unallocated / the best baseline's unallocated of the same seed (None: no baseline).
    median_reduction: float | None
    median_preempted: float
    median_migrations: float


def spread_over_seeds(runs: Sequence[Sequence[InflationResult]]) -> list[SeedSpread]:
    """``runs``: per seed, the results of every policy of that seed."""
    by_policy: dict[str, list[tuple[InflationResult, float | None]]] = {}
    for results in runs:
        best = compare_to_baselines(results)
        for r in results:
            cut = 1 - r.unallocated_gpus / best.unallocated_gpus if best else None
            by_policy.setdefault(r.policy, []).append((r, cut))
    spreads = []
    for policy, items in by_policy.items():
        unallocated = [r.unallocated_gpus for r, _ in items]
        cuts = [c for _, c in items if c is not None]
        spreads.append(
            SeedSpread(
                policy=policy,
                seeds=len(items),
                median_unallocated=statistics.median(unallocated),
                min_unallocated=min(unallocated),
                max_unallocated=max(unallocated),
                median_reduction=statistics.median(cuts) if cuts else None,
                median_preempted=statistics.median(r.preempted for r, _ in items),
                median_migrations=statistics.median(r.migrations for r, _ in items),
            )
        )
    return spreads
