"""The wire's and the control plane's words become the solver's in one table each, at the
boundary (``app.shaping``): every word has exactly one counterpart, and the stored strings
of the control plane are the ones they always were."""

from app.actions.models import ActionKind
from app.shaping.cycle import ACTION_KINDS
from app.shaping.snapshot import JOB_SHAPES, NODE_STATES
from solver import instance as si
from solver import plan as sp
from wire.telemetry import JobShape, NodeState


def test_every_node_state_maps_onto_the_solvers() -> None:
    assert NODE_STATES == {
        NodeState.up: si.NodeState.up,
        NodeState.draining: si.NodeState.draining,
        NodeState.down: si.NodeState.down,
    }
    assert set(NODE_STATES.values()) == set(si.NodeState)


def test_every_job_shape_maps_onto_the_solvers() -> None:
    assert JOB_SHAPES == {
        JobShape.block: si.JobShape.block,
        JobShape.elastic: si.JobShape.elastic,
    }
    assert set(JOB_SHAPES.values()) == set(si.JobShape)


def test_every_planned_action_kind_has_a_stored_kind_of_the_same_name() -> None:
    assert set(ACTION_KINDS) == set(sp.ActionKind)
    assert {planned.value: stored.value for planned, stored in ACTION_KINDS.items()} == {
        "start": "start",
        "migrate": "migrate",
        "resize": "resize",
        "preempt": "preempt",
        "requeue": "requeue",
    }
    # The control plane's own saga kinds are not the solver's to plan (a move comes from
    # a federation group's plan: app.federation.moves; a drain or undrain, or an Armada job
    # set's move, from an operator).
    assert set(ActionKind) - set(ACTION_KINDS.values()) == {
        ActionKind.reserve,
        ActionKind.unreserve,
        ActionKind.resume,
        ActionKind.move,
        ActionKind.drain,
        ActionKind.undrain,
        ActionKind.move_job_set,
    }
