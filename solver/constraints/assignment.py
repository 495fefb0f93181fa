"""Each class places at most its jobs (or missing replicas); the value of what is placed.

Value per block job: weight × overdue boost × GPUs × speed of the pool's model, less the
transfer of its image when the pool is in a cluster other than its home.
Value per elastic replica: weight × GPUs × (speed + elastic_unmet_weight): it is served
work and it removes unmet demand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from solver.objective import SCALE

if TYPE_CHECKING:
    from solver.model import PlacementModel


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    terms: list[tuple[int, cp_model.IntVar]] = []
    unmet_weight = model.config.elastic_unmet_weight
    for job_class in model.classes:
        options = model.options_by_class.get(job_class.index, [])
        if not options:
            continue
        model.model.add(sum(o.var for o in options) <= job_class.size).with_name(
            f"assign_c{job_class.index}"
        )
        for option in options:
            speed = job_class.speed_on(option.pool)
            if job_class.elastic:
                value = job_class.weight * job_class.gpus_per_replica * (speed + unmet_weight)
            else:
                value = job_class.weight * job_class.boost * job_class.total_gpus * speed
                home = job_class.home_cluster
                if home is not None and option.pool.cluster != home:
                    value -= job_class.remote_cost
            terms.append((round(value * SCALE), option.var))
    return terms
