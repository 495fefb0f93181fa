"""The causes of idle GPUs, in precedence order: the first that applies to a GPU wins.

A GPU is *idle* when it does no work: it is free (no job holds it), its node is down, or
it is allocated but its measured busy fraction is below the threshold, or it is held by a
service above its demand. Every idle GPU gets exactly one cause, so the causes add up to
the idle GPUs (and, integrated, to the idle GPU-hours).

The order goes from what no scheduler could change to what the scheduler chose:

1. ``draining_down`` — the node is down (all its GPUs) or draining (its free GPUs): no
   placement decision could use them, so nothing else is asked.
2. ``reservation`` — held on purpose: free GPUs set aside (a plan's reservation, a
   service's forecast) or a service's replicas above its current demand (the forecast
   peak). A decision made them idle; it is named before any measurement of them.
3. ``allocated_idle`` — a job holds them but the measured busy fraction is below the
   threshold: the job, not the scheduler, leaves them idle.
4. ``no_demand`` — free, and nothing is queued on the cluster.
5. ``heterogeneity`` — free, work is queued, but no queued job accepts this GPU model.
6. ``quota`` — queued jobs accept the model, but every one of them belongs to a team at
   its limit (guaranteed + borrowing limit): policy, not shape, keeps them out.
7. ``queue_order`` — an admissible queued job fits here (its smallest piece fits this
   node's free GPUs and its whole gang fits the free GPUs it accepts) yet waits: the
   scheduler's order (FIFO head-of-line blocking) or its cadence left it queued.
8. ``gang_waiting`` — an admissible job's piece fits here, but its gang cannot be
   completed on the free GPUs: these GPUs wait for the rest of the gang.
9. ``fragmentation`` — admissible jobs wait, but none fits this node's free GPUs.

7–9 are asked of the same admissible jobs, most hopeful first: if any job could start
here, the cause is the scheduler's, not the shape's.
"""

from __future__ import annotations

from enum import StrEnum


class IdleCause(StrEnum):
    # Declared in precedence order (``PRECEDENCE``); the module docstring says why.
    draining_down = "draining_down"
    reservation = "reservation"
    allocated_idle = "allocated_idle"
    no_demand = "no_demand"
    heterogeneity = "heterogeneity"
    quota = "quota"
    queue_order = "queue_order"
    gang_waiting = "gang_waiting"
    fragmentation = "fragmentation"


PRECEDENCE: tuple[IdleCause, ...] = tuple(IdleCause)
