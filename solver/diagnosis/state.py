"""One cluster at one instant, as the idle-GPU classifier reads it.

Plain frozen dataclasses rather than pydantic models: the simulator builds one at every
event, and validation there would cost more than the classification. A node's ``state`` is
the solver's :class:`~solver.instance.NodeState`, the same word the instance uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from solver.instance import NodeState

DEFAULT_BUSY_THRESHOLD = 0.1


@dataclass(frozen=True, slots=True)
class NodeAt:
    name: str
    gpu_model: str
    gpus: int
    state: NodeState = NodeState.up
    # Free GPUs of this node set aside (a plan's reservation, a service's forecast); they
    # are not free for queued work.
    reserved_gpus: int = 0
    reserved_for: str | None = None  # the team they are held for, where one is known


@dataclass(frozen=True, slots=True)
class AllocationAt:
    """GPUs of one node held by one job or service."""

    node: str
    team: str
    gpus: int
    # Measured busy fraction of these GPUs (0..1); None when not measured, and then they
    # count as busy: only a measurement can call an allocated GPU idle.
    busy: float | None = None
    # How many of these GPUs the owner holds above its current demand (a service's
    # replicas kept for its forecast peak): idle by reservation whatever ``busy`` says.
    # A fraction where demand is measured finer than whole replicas (the simulator).
    above_demand: float = 0


@dataclass(frozen=True, slots=True)
class QueuedJobAt:
    """A queued job: ``members`` pieces of ``gpus // members`` GPUs, each on one node,
    spread over at most ``max_nodes`` nodes (None: as many as it likes).

    The control plane's gang of ``gang_size`` members is ``members = gang_size``; the
    simulator's job that may split its GPUs over up to ``s`` nodes is ``members = gpus``,
    ``max_nodes = s``."""

    team: str
    gpus: int
    gpu_models: frozenset[str] = frozenset()  # empty: any model
    members: int = 1
    max_nodes: int | None = None

    @property
    def gpus_per_member(self) -> int:
        return max(1, self.gpus // max(1, self.members))

    @property
    def smallest_piece(self) -> int:
        """The fewest GPUs it must put on some one node: all its members spread over as
        many nodes as it may use."""
        per_node = -(-self.members // self.max_nodes) if self.max_nodes else 1
        return self.gpus_per_member * max(1, per_node)

    def accepts(self, gpu_model: str) -> bool:
        return not self.gpu_models or gpu_model in self.gpu_models


@dataclass(frozen=True, slots=True)
class ClusterAt:
    nodes: tuple[NodeAt, ...]
    allocations: tuple[AllocationAt, ...] = ()
    queue: tuple[QueuedJobAt, ...] = ()
    # Team → the most GPUs it may hold (guaranteed + borrowing limit); a team absent here
    # has no cap.
    quota_caps: Mapping[str, int] = field(default_factory=dict)
    busy_threshold: float = DEFAULT_BUSY_THRESHOLD
