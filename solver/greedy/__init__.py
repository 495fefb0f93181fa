"""Rule-based engine, legal by construction: every change goes through
:class:`solver.state.ClusterState` and is checked against the hard constraints before it
is kept. One engine, configured by :class:`GreedyOptions`, is behind all four policies.

Frozen jobs (``Instance.is_frozen``: Shaper acted on them within the dwell time, their
move budget is spent, or a saga is acting on them) are left exactly as they are in every
policy: never started, moved, resized, preempted or requeued, and a frozen pending job
neither blocks the FIFO queue nor takes a reservation. Jobs past their SLA's max queue
wait go first, in every order, after services have scaled down and before they scale up.

One module per phase, sharing one :class:`~solver.greedy.ledger.Ledger`:

``engine``           the phases in order (the algorithm is in its docstring) and the face
                     the CP-SAT pass uses
``options``          what configures a pass: order, elastic mode, levers
``ledger``           the state and bookkeeping the phases share
``admission``        pending block jobs in order, best fit, gangs
``elastic``          services: scale down, scale up, grow by moving or stopping block work
``preemption``       stop lower-priority work when the value trade favours it
``shortest_remaining`` stop longer work of no more weight for a short job (off by default)
``defragmentation``  move checkpointable jobs off nodes to make room
``backfill``         EASY backfill around a blocked or starving job
``lookahead``        capacity held for services' coming peaks
``diagnosis``        a reason for every job left pending
``sharing``          fractional jobs (shares of one GPU), placed around the whole-GPU plan
``mig_placement``    MIG jobs (one GPU instance of a profile), placed after the shares
``holders``          the GPUs shares and MIG instances use, kept out of the whole-GPU plan
"""

from solver.greedy.engine import GreedyEngine, Rebase, greedy_plan, run_greedy
from solver.greedy.ledger import GreedyResult
from solver.greedy.options import ElasticMode, GreedyOptions, Order, sort_key

__all__ = [
    "ElasticMode",
    "GreedyEngine",
    "GreedyOptions",
    "GreedyResult",
    "Order",
    "Rebase",
    "greedy_plan",
    "run_greedy",
    "sort_key",
]
