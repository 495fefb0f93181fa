"""A running job's own residency holds it in the clusters it names, even where the group
plan would gain by moving it (issue 16): the group of ``test_federation_running_moves``,
where moving the small checkpointable job from east to west lets an 8-GPU gang start at
east, with the small job's connector reporting a residency (``JobReport.residency``,
wire.residency) that forbids west, or allows it.

The group plan decides which running jobs may move where in
``app.federation.planning.solve_group`` (``_running_movable``: the job's own residency
beside its team's rule); the solver only moves a job among the clusters it is given.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlmodel import Session

from app.federation import planning
from tests.app.test_federation_moves import GROUP, Group
from tests.app.test_federation_running_moves import group_factory  # noqa: F401 (fixture)
from wire.residency import Residency


@pytest.mark.parametrize(
    ("residency", "why"),
    [
        (Residency(allowed_clusters=["east"]), "allowed_clusters [east]"),
        (Residency(allowed_clusters=[]), "allowed_clusters []"),
        (Residency(cluster_selector={"region": "eu"}), "cluster_selector region=eu"),
    ],
)
def test_a_running_job_whose_residency_forbids_the_other_cluster_is_not_moved_there(
    group_factory: Callable[..., Group],  # noqa: F811 (the fixture imported above)
    residency: Residency,
    why: str,
) -> None:
    group = group_factory(residency=residency)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == [] and outcome.skipped == {}, outcome
    with Session(group.engine) as session:
        solved = planning.solve_group(session=session, name=GROUP, now=group.east.clock.now)
    assert solved.moves == [] and solved.movable_running_jobs == 0
    assert solved.running_stays == {
        "east/small": f"its own residency ({why}) lets it go to none of west",
        "west/resident": "it cannot checkpoint: it would start over",
    }
    assert group.east.states() == {"small": "running", "gang": "pending"}


def test_a_running_job_whose_residency_names_the_other_cluster_is_moved_there(
    group_factory: Callable[..., Group],  # noqa: F811 (the fixture imported above)
) -> None:
    """The control case: the same move is proposed when the job's residency allows west."""
    group = group_factory(residency=Residency(allowed_clusters=["west"]))
    outcome = group.plan()
    assert len(outcome.proposed) == 1, outcome
    action = group.action(outcome.proposed[0])
    assert action.job_id == group.job("east", "small").id
    assert (action.source_node, action.target_node) == ("east1", "west1")
