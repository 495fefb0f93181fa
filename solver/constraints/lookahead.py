"""Elastic look-ahead: GPUs a service's forecast needs within the horizon stay free of long,
immovable new jobs (non-checkpointable, running past the moment the service needs them).
Other new work may use them: it can be moved or will have finished."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from solver.model import Option, PlacementModel


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    free_by_group: dict[int, int] = {}
    for pool in model.pools:
        free_by_group[pool.group] = free_by_group.get(pool.group, 0) + pool.free_gpus
    options_by_reserve: dict[int, list[Option]] = {}
    for option in model.options:
        for index in option.job_class.reserves:
            if option.pool.group in model.reserves[index].groups:
                options_by_reserve.setdefault(index, []).append(option)
    for index, reserve in enumerate(model.reserves):
        options = options_by_reserve.get(index)
        if not options:
            continue
        free = sum(free_by_group.get(group, 0) for group in reserve.groups)
        model.model.add(
            sum(o.nodes * o.chunk_gpus * o.var for o in options) <= max(0, free - reserve.gpus)
        ).with_name(f"lookahead_{index}")
    return []
