"""Upgrades: a running checkpointable job moves onto GPUs faster for it as they free up.

A scheduler that decides once, at start, leaves a job on whatever GPUs were free when it
started: a job that could only start on the slowest model crawls there long after faster
ones have freed (on Gavel's measurements a ResNet-18 runs at 0.08 of its V100 speed on a
K80). Gavel re-allocates every round; here, after the queue is placed, what is still
free on faster models goes to the running jobs that gain most from it, each move a
trade: the run time it saves, ``time_left · (1 − s_now / s_new)`` at the job's own speeds
(``Instance.job_speed``: its ``Instance.speeds``, else the models'), must exceed
``UPGRADE_MARGIN`` times the migration's time (``MigrationCostModel.migration_seconds``).

Runs after admission, so a pending job is never kept off free GPUs by an upgrade; it takes
only GPUs the look-ahead does not keep for a service's coming peak and nodes no
backfill reservation holds, within the cycle's migration budget, and only jobs
defragmentation may move (checkpointable, on one node, not frozen, off their migration
cooldown and under their daily limit, not touched this cycle) whose scheduler can be told
where they go (``migratable``), within their cluster. A job without a run-time
estimate is not moved: nothing says the move pays.
"""

from __future__ import annotations

from solver.greedy.defragmentation import Defragmentation
from solver.greedy.ledger import Ledger
from solver.greedy.lookahead import Lookahead
from solver.instance import Job
from solver.plan import Reason, ReasonCode

UPGRADE_MARGIN = 2.0  # saved run time over the migration's time


class Upgrades:
    def __init__(
        self, ledger: Ledger, defragmentation: Defragmentation, lookahead: Lookahead
    ) -> None:
        self.ledger = ledger
        self.defragmentation = defragmentation
        self.lookahead = lookahead

    def run(self, avoid: set[int]) -> None:
        """Move what pays, the jobs that would save the most weighted GPU-time first;
        ``avoid``: nodes a backfill reservation holds."""
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        ranked: list[tuple[float, str, Job, float]] = []
        for job in instance.jobs:
            if (
                not job.migratable
                or not self.defragmentation.may_move(job.id)
                or job.id not in state.placement
            ):
                continue
            left = instance.time_left(job)
            if left is None:
                continue
            now = min(ledger.job_speed(job, node) for node in state.placement[job.id])
            best = max((state.group_speed(g, job) for g in self._groups(job)), default=0.0)
            if best <= now:
                continue
            most = ledger.weight[job.id] * job.total_gpus * left * (1.0 - now / best)
            ranked.append((-most, job.id, job, now))
        ranked.sort(key=lambda entry: entry[:2])
        budget = ledger.config.max_migrations_per_cycle
        for _, _, job, now in ranked:
            if ledger.migrations >= budget:
                return
            self._try(job, now, avoid)

    def _try(self, job: Job, now: float, avoid: set[int]) -> None:
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        faster = [g for g in self._groups(job) if state.group_speed(g, job) > now]
        if self.lookahead.reservations_for(job):
            faster = self.lookahead.allowed_groups(job, faster)
        if not faster:
            return
        node = state.find_single_node(job, job.replicas, faster, avoid or None)
        if node is None:
            return
        speed = ledger.job_speed(job, node)
        left = instance.time_left(job) or 0.0
        saved = left * (1.0 - now / speed)
        if saved <= UPGRADE_MARGIN * instance.migration.migration_seconds(job):
            return
        state.evict(job)
        state.place(job, {node: job.total_gpus})
        ledger.migrations += 1
        ledger.touch(job.id)
        name = instance.nodes[node].name
        ledger.result.decisions[job.id] = Reason(
            code=ReasonCode.faster_gpus,
            message=f"moved to {name}, where it runs at {speed:.2f} instead of {now:.2f} "
            f"(reference GPU = 1): about {saved / 3600:.1f} h sooner done",
        )

    def _groups(self, job: Job) -> list[int]:
        """Where running ``job`` may move up: its own cluster's groups (a move to another
        cluster is the federation's, priced apart)."""
        state = self.ledger.state
        return state.in_cluster_of(state.ready_groups(job), state.placement[job.id])
