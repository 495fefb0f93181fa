"""Max queue wait as a hard rule: at least ``required`` overdue jobs placed.

How many is decided before the main search by the overdue pass of ``solver.solve``
(``solver.overdue_pass``): the most any solution of the same model places. This family only
names the variables it counts and adds the requirement; unlike the others it is not part
of ``PlacementModel.build()``, since its bound needs a solve of the built model.

The model aggregates node-level packing (see ``solver.model``), so the count is about
pools, not nodes: a job the realisation cannot pack is retried by the greedy fill, and
``solver.validate`` (rule 10) rejects a final plan that leaves an overdue job pending on
free GPUs it fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from solver.model import PlacementModel


def overdue_options(model: PlacementModel) -> list[cp_model.IntVar]:
    """The counts of overdue block jobs placed, one per option."""
    return [o.var for o in model.options if o.job_class.overdue and not o.job_class.elastic]


def require(model: PlacementModel, required: int, *, proven: bool) -> None:
    """At least ``required`` overdue jobs placed (``proven``: the most any solution places)."""
    if required > 0:
        model.model.add(sum(overdue_options(model)) >= required).with_name("overdue_placed")
    model.overdue_required = required
    model.overdue_proven = proven
