"""Gang-aware placement: which node a small placement should take so that the free GPUs
left behind stay usable by the gangs actually waiting (``SolverConfig.gang_aware_placement``,
off by default: measured in the README, "Ablations", it changed nothing on the built-in
scenarios and cost a little on the contended Philly window).

Best fit alone can leave holes: with 2-GPU gangs waiting, a 1-GPU job on a node with 2
free GPUs leaves 1 that none of them can use; on a node with 3 free it leaves 2. As FGD
does for a pod mix (``sim/fgd/fragmentation.py``), a node's *waste* is its expected
fragmentation against the waiting block jobs: the share of them whose per-node piece does
not fit its free GPUs, times those free GPUs (a gang that fits one node is one piece of its
total GPUs; a larger one spreads in pieces of ``gpus_per_replica``). A candidate node is
scored by how much the placement raises the waste; among equals the engine's own order
(fastest model, keep whole nodes, tightest) decides, so with nothing waiting the placement
is best fit.

The waiting jobs are the block jobs pending at the start of the cycle; one stops counting
when the cycle places it and counts again if that placement is undone, so the shapes
follow the queue as the greedy works through it. A job never counts against its own
placement.
"""

from __future__ import annotations

from collections import Counter

from solver.compat import Compatibility
from solver.instance import Instance, Job


class GangFit:
    def __init__(self, instance: Instance, compat: Compatibility) -> None:
        self.compat = compat
        self._node_gpus = [node.gpus for node in instance.nodes]
        # Largest node per group: a gang no larger fits one node and is one piece.
        self._group_gpus = [
            max((self._node_gpus[n] for n in group.node_indices), default=0)
            for group in compat.groups
        ]
        frozen = instance.frozen_ids
        self._version = 0  # bumped whenever the waiting shapes change
        self._cache: dict[tuple[object, ...], float] = {}
        self._pieces: dict[str, list[tuple[int, int]]] = {}  # job -> (group, piece size)
        self._counts: list[Counter[int]] = [Counter() for _ in compat.groups]
        for job in instance.jobs:
            if job.is_elastic or job.is_running or job.id in frozen:
                continue
            pieces = []
            for group in compat.ready_groups_for(job):
                if job.total_gpus <= self._group_gpus[group]:
                    pieces.append((group, job.total_gpus))
                else:
                    pieces.append((group, job.gpus_per_replica))
            if pieces:
                self._pieces[job.id] = pieces
                self._apply(pieces, +1)

    def _apply(self, pieces: list[tuple[int, int]], sign: int) -> None:
        for group, size in pieces:
            self._counts[group][size] += sign
        self._version += 1

    # -- the state's hooks ---------------------------------------------------------------

    def started(self, job: Job) -> None:
        """``job`` went from holding nothing to holding GPUs: it no longer waits."""
        pieces = self._pieces.get(job.id)
        if pieces is not None:
            self._apply(pieces, -1)

    def stopped(self, job: Job) -> None:
        """``job`` went back to holding nothing: it waits again."""
        pieces = self._pieces.get(job.id)
        if pieces is not None:
            self._apply(pieces, +1)

    # -- scoring -------------------------------------------------------------------------

    def waste_increase(self, job: Job, node: int, free: int, need: int) -> float:
        """How many more of ``node``'s free GPUs no waiting gang can use once ``need`` of
        its ``free`` GPUs go to ``job`` (negative: fewer)."""
        group = self.compat.group_of_node[node]
        own = None
        for piece_group, size in self._pieces.get(job.id, ()):
            if piece_group == group:
                own = size
        return self._waste(group, free - need, own) - self._waste(group, free, own)

    def _waste(self, group: int, free: int, own: int | None) -> float:
        """FGD's expected fragmentation of ``free`` GPUs against the waiting jobs: over
        the waiting jobs of the group (``own`` left out), the share whose piece does not
        fit in ``free``, times ``free``."""
        if free <= 0:
            return 0.0
        key = (self._version, group, free, own)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if len(self._cache) > 4096:
            self._cache.clear()
        total = 0
        too_large = 0
        for size, count in self._counts[group].items():
            if own == size:
                count -= 1
            if count <= 0:
                continue
            total += count
            if size > free:
                too_large += count
        waste = free * too_large / total if total else 0.0
        self._cache[key] = waste
        return waste
