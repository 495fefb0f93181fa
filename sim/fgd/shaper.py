"""Shaper's policies in the inflation experiment: what they do when a pod fits nowhere.

A Shaper policy places every pod as its ``placement`` policy does (default ``fgd``, the
best placement on the default trace; any baseline can be given) and, when a GPU pod fits
nowhere, makes room for it (:data:`MAKE_ROOM`, by policy name):

* ``shaper-defrag``: an in-node repack of movable GPU-sharing pods, then moves of
  checkpointable pods to other nodes within a budget of moves (:mod:`sim.fgd.migration`);
* ``shaper-preempt``: the same, then, for a pod above best-effort QoS, preemption of
  best-effort pods where that pays in GPU (:mod:`sim.fgd.preemption`).

They are the simulator's stand-in for the solver's defragmentation; ``shaper-solver``
(:mod:`sim.fgd.through_solver`) runs the experiment through the solver itself, now that
``solver.Instance`` models fractional GPUs (``Job.gpu_milli``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.migration import defragment, repack_somewhere
from sim.fgd.pod import Pod
from sim.fgd.preemption import preempt_for


@dataclass(frozen=True, slots=True)
class Room:
    """What making room for a pod cost: pods migrated, and pods preempted for good."""

    migrations: int
    preempted: int = 0


class MakeRoom(Protocol):
    """Place ``pod``, which fits nowhere, by moving others; None: nothing changed."""

    def __call__(
        self,
        cluster: Cluster,
        pod: Pod,
        rng: np.random.Generator,
        mix: TaskMix,
        *,
        budget: int,
        placement: str,
    ) -> Room | None: ...


def defragment_for(
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    *,
    budget: int,
    placement: str,
) -> Room | None:
    """``shaper-defrag``: a repack inside one node, else moves of pods off one node."""
    repacked = repack_somewhere(cluster, pod)
    if repacked is not None:
        return Room(migrations=repacked)
    done = defragment(cluster, pod, rng, mix, budget, placement)
    return Room(migrations=done[2]) if done is not None else None


def defragment_or_preempt_for(
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    *,
    budget: int,
    placement: str,
) -> Room | None:
    """``shaper-preempt``: as ``shaper-defrag``, then best-effort pods yield to the others."""
    room = defragment_for(cluster, pod, rng, mix, budget=budget, placement=placement)
    if room is not None or pod.best_effort:
        return room
    made = preempt_for(cluster, pod, rng, mix, placement)
    return Room(migrations=made[0], preempted=made[1]) if made is not None else None


MAKE_ROOM: dict[str, MakeRoom] = {
    "shaper-defrag": defragment_for,
    "shaper-preempt": defragment_or_preempt_for,
}
SHAPER_POLICIES = tuple(MAKE_ROOM)
