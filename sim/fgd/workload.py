"""The inflation experiment's workload: the pod list, read, shuffled and inflated.

As the reference's ``workloadTuningConfig`` (ratio 1.3) with ``shufflePod``: every pod of
the list once, in a seeded random order, then pods drawn at random with replacement and
appended until the next one would take the GPU requests past ``target`` × the cluster's
GPU capacity (if the list alone asks for more, random pods are dropped instead). Pods
arrive one by one and never leave. A pod list with only the resource columns will do
(:func:`read_pods` says what the others default to); a missing one is a
:class:`~sim.traces.common.TraceError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.fgd.pod import FULL, Pod
from sim.traces.alibaba import POD_REQUIRED, pod_models, pod_qos, require_columns
from sim.traces.common import TraceError, csv_rows, refuse_no_rows, whole

MOVABLE = ("be", "all")  # which pods Shaper may migrate: best-effort ones, or every pod


def read_pods(path: str | Path, *, movable: str = "be") -> list[Pod]:
    """Every pod of the list, CPU-only ones included (they take CPU and memory).

    The list needs the resource columns (``sim.traces.alibaba.POD_REQUIRED``: ``cpu_milli``,
    ``memory_mib``, ``num_gpu``, ``gpu_milli``) and may have only those: without
    ``gpu_spec`` a pod takes any GPU model, without ``qos`` it is best effort (``BE``, as
    an empty value is), and no time column is read (pods arrive in a seeded shuffle of the
    list). ``movable``: which pods Shaper may migrate: ``be`` (best-effort QoS only, as in
    the trace replays) or ``all`` (transparent checkpointing of every pod)."""
    if movable not in MOVABLE:
        raise ValueError(f"movable must be 'be' or 'all', not {movable!r}")
    pods = []
    # The replay loaders' reader: a short or long row, a byte-order mark, a gzip file or a
    # directory is refused (or read) as there, with the line.
    header, rows = csv_rows(path)
    require_columns(path, header, POD_REQUIRED, what="pod list")
    for line, row in rows:
        try:
            gpus, cpu, mem, milli = (
                whole(row[column] or 0, column)
                for column in ("num_gpu", "cpu_milli", "memory_mib", "gpu_milli")
            )
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
        best_effort = pod_qos(row) == "BE"
        pods.append(
            Pod(
                cpu=cpu,
                mem=mem,
                gpus=gpus,
                milli=min(milli, FULL) if gpus == 1 else (FULL if gpus else 0),
                models=pod_models(row),
                checkpointable=movable == "all" or best_effort,
                best_effort=best_effort,
            )
        )
    refuse_no_rows(path, len(pods), why="the pod list has no rows after its header")
    return pods


def inflated_workload(
    pods: Sequence[Pod], capacity: int, target: float, rng: np.random.Generator
) -> list[Pod]:
    """Every pod once in random order, then random pods appended (or random pods dropped)
    until the GPU requests reach ``target`` × ``capacity`` (the reference's tuning)."""
    order = [pods[i] for i in rng.permutation(len(pods))]
    goal = target * capacity
    total = sum(p.gpu_request for p in order)
    if total > goal:
        while total > goal and order:
            total -= order.pop(int(rng.integers(len(order)))).gpu_request
        return order
    if not any(p.milli for p in pods):
        return order  # no pod asks for a GPU: drawing more would never reach the goal
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        # The reference checks the per-GPU milli here, then adds the whole request.
        if total + pod.milli > goal:
            return order
        total += pod.gpu_request
        order.append(pod)
