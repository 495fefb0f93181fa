"""An operator's drain and undrain of a node, as actions (``NODE_ACTION_KINDS``).

``POST /api/v1/clusters/{cluster}/nodes/{node}/drain`` (and ``/undrain``) makes an action
about the node, not a job — no job, ``source_node`` and ``target_node`` naming the node —
approved by the operator who asked, which the caller dispatches: its saga
(``app.actions.recipes.node_steps``) asks the cluster's connector to drain the node and
then reads it back. Refused (Conflict) while another drain or undrain of the node has not
ended, and when the control plane's view already has the node in the state asked for
(draining for a drain, up for an undrain). The node's row is locked while deciding, so
two requests for one node make one action.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.models import (
    ACTIVE_ACTION_STATES,
    NODE_ACTION_KINDS,
    Action,
    ActionKind,
    ActionPublic,
    ActionState,
)
from app.audit.models import Actor
from app.clusters import service as cluster_service
from app.clusters.models import Cluster
from app.core.errors import Conflict
from app.core.lookup import found, row_id
from app.nodes.models import Node
from wire.telemetry import NodeState

# The node state that makes each kind pointless (409).
_ALREADY = {ActionKind.drain: NodeState.draining, ActionKind.undrain: NodeState.up}


def request_node_action(
    *,
    session: Session,
    cluster: str,
    node: str,
    kind: ActionKind,
    reason: str | None,
    now: datetime,
    actor: Actor | None,
) -> ActionPublic:
    """Make an approved drain or undrain action for ``node`` of ``cluster`` (NotFound for
    an unknown cluster or node, Conflict when it would do nothing or another is unfinished);
    the caller dispatches it once this has committed."""
    if kind not in NODE_ACTION_KINDS:
        raise ValueError(f"{kind} is not an action on a node")
    row = cluster_service.get_cluster(session=session, name=cluster)
    # The cluster's row first, FOR KEY SHARE, as the action's foreign key check would take
    # it after the node: a deletion of the cluster locks its row, then its nodes.
    session.exec(
        select(Cluster.id).where(Cluster.id == row.id).with_for_update(read=True, key_share=True)
    ).first()
    target = found(
        session.exec(
            select(Node)
            .where(Node.cluster_id == row.id, Node.name == node)
            .with_for_update()  # one decision per node at a time
        ).first(),
        f"cluster {cluster!r} has no node {node!r}",
        resource="node",
        resource_id=node,
    )
    unfinished = session.exec(
        select(Action.id, Action.kind, Action.state).where(
            Action.cluster_id == row.id,
            Action.source_node == node,
            col(Action.kind).in_([k.value for k in NODE_ACTION_KINDS]),
            col(Action.state).in_(
                [ActionState.proposed.value, *(s.value for s in ACTIVE_ACTION_STATES)]
            ),
        )
    ).first()
    if unfinished is not None:
        other, other_kind, other_state = unfinished
        raise Conflict(
            f"node {node} of cluster {cluster}: action {other} ({other_kind}) on it is "
            f"{other_state}; wait for it to end or cancel it",
            resource="node",
            resource_id=node,
            details={"action_id": other, "state": str(other_state)},
        )
    state = NodeState(target.state)
    if state is _ALREADY[kind]:
        raise Conflict(
            f"node {node} of cluster {cluster} is {state.value} already: nothing to {kind.value}",
            resource="node",
            resource_id=node,
            details={"state": state.value},
        )
    return action_service.create_operator_action(
        session=session,
        cluster_id=row_id(row),
        kind=kind,
        subject={"source_node": node, "target_node": node},
        reason=reason,
        what=f"{kind.value} of node {node}",
        now=now,
        actor=actor,
        changes={"cluster": cluster, "node": node},
    )
