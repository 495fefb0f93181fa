"""Several clusters planned alone or as one federation group: the runs and their table.

Each multi-cluster scenario (``sim/scenarios/federation/``) runs under every policy of
:data:`POLICIES`: per-cluster FIFO, priority and Shaper stand for today's schedulers (and
today's Shaper), each planning its own cluster; ``federated-priority`` is a priority
scheduler that dispatches any job to any cluster of the group (what MultiKueue or Armada
do for one scheduler family: the strongest federated baseline here), ``federated-shaper``
is Shaper planning the group as one instance (``sim.adapter``'s module docstring).

The table puts every figure side by side and says what federation gains over per-cluster
Shaper and where federated Shaper stands against the federated baseline, scenario by
scenario, including those where it does not pay. It counts the GiB of images that crossed
between clusters and, where egress is priced (the scenario's
``transfer.inter_cluster_egress_gpu_s_per_gib`` or :func:`with_egress`), what that cost in
GPU-hours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sim.metrics import RunResult
from sim.report import cell, gains
from sim.workload import Workload

PER_CLUSTER = ("fifo", "priority", "shaper")
POLICIES = (*PER_CLUSTER, "federated-priority", "federated-shaper")
MINE, MINE_ALONE, FEDERATED_BASELINE = "federated-shaper", "shaper", "federated-priority"

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("utilization", "util %", "pct"),
    ("weighted_output", "value", "num"),
    ("jobs_completed", "done", "int"),
    ("jct_mean_h", "JCT mean h", "cens"),
    ("jct_p99_h", "JCT p99 h", "cens"),
    ("makespan_h", "makespan h", "cens"),
    ("queue_wait_max_h", "wait max h", "cens"),
    ("unmet_demand_replica_hours", "unmet demand rep-h", "num"),
    ("remote_starts", "cross-cluster starts", "int"),
    ("migrations", "migr.", "int"),
    ("migration_gpu_hours", "transfer+migr. GPU-h", "num"),
    ("gib_crossed", "GiB crossed", "num"),
    ("egress_gpu_hours", "egress GPU-h", "num"),
)


def with_egress(workload: Workload, gpu_s_per_gib: float) -> Workload:
    """``workload`` with its cross-cluster data priced at ``gpu_s_per_gib`` (the price of a
    GiB over the price of a GPU-hour, × 3600); ``ValueError`` naming the setting if < 0."""
    transfer = replace(workload.transfer, inter_cluster_egress_gpu_s_per_gib=gpu_s_per_gib)
    return replace(workload, transfer=transfer)


def _margin(results: Mapping[str, RunResult], mine: str, other: str) -> str:
    if mine not in results or other not in results:
        return "–"
    delta = gains(results, other)[mine]
    jct = delta["jct_change_pct"]
    jct_text = "–" if jct != jct else f"{jct:+.1f} %"  # NaN: undefined
    return (
        f"{delta['util_points']:+.1f} pt util, {delta['value_gain_pct']:+.1f} % value, "
        f"mean JCT {jct_text}"
    )


def federation_table(
    results: Mapping[str, Mapping[str, RunResult]], policies: Sequence[str] = POLICIES
) -> str:
    """Markdown: one row per scenario and policy, then per scenario what federated Shaper
    gains over per-cluster Shaper and over the federated baseline."""
    head = ["scenario", "policy", *(title for _, title, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario, runs in results.items():
        for policy in policies:
            if policy in runs:
                cells = [cell(runs[policy], key, kind) for key, _, kind in COLUMNS]
                lines.append("| " + " | ".join([scenario, policy, *cells]) + " |")
    lines.append("")
    for scenario, runs in results.items():
        lines.append(
            f"- {scenario}: {MINE} vs per-cluster {MINE_ALONE}: "
            f"{_margin(runs, MINE, MINE_ALONE)}; vs {FEDERATED_BASELINE}: "
            f"{_margin(runs, MINE, FEDERATED_BASELINE)}"
        )
    return "\n".join(lines)
