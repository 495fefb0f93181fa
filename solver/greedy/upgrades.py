"""Upgrades: a running checkpointable job moves onto GPUs faster for it as they free up.

A scheduler that decides once, at start, leaves a job on whatever GPUs were free when it
started: a job that could only start on the slowest model crawls there long after faster
ones have freed (on Gavel's measurements a ResNet-18 runs at 0.08 of its V100 speed on a
K80). Gavel re-allocates every round; here, after the queue is placed, what is still
free on faster models goes to the running jobs that gain most from it, each move a
trade: the run time it saves, ``time_left · (1 − s_now / s_new)`` at the job's own speeds
(``Instance.job_speed``: its ``Instance.speeds``, else the models'), must exceed
``UPGRADE_MARGIN`` times the migration's time (``MigrationCostModel.migration_seconds``).

The trade is not the objective's: the objective weighs a move's time against one value
horizon (an hour) of the speed it gains, and so would never pay for an upgrade that saves
a day on a week-long job while costing more than an hour's gain; the rule weighs the whole
run time it saves instead (with a margin for the estimate's error).

Runs after admission, so a pending job is never kept off free GPUs by an upgrade, and the
queue then gets one more pass, without moves or stops, onto what upgrades leave free. It
takes no node a backfill reservation holds, stays within the cycle's migration budget,
and, like admission, may take GPUs the look-ahead keeps for a service's coming peak from
jobs that cannot leave: an upgraded job is checkpointable and can leave. Only jobs
defragmentation may move (checkpointable, on one node, not frozen, off their migration
cooldown and under their daily limit, not touched this cycle) whose scheduler can be told
where they go (``migratable``), within their cluster. A job without a run-time
estimate is not moved: nothing says the move pays.

A gang that spans nodes (``SolverConfig.gang_upgrades``) moves too, whole, onto as many
nodes of one faster model as it needs (``ClusterState.find_gang``, within its node
limit): a job that started on two K80 nodes because that was what was free would
otherwise run there for days beside V100s that freed an hour later (heterogeneous-
throughput seed 3: 963 h). It is no one node's process image: its scheduler stops it,
it writes its own checkpoint, and it starts again pinned to the new nodes from that
checkpoint (``app.actions.recipes``), priced as a migration. Elastic training jobs are
left to their resizes (``solver.elastic_training``), which choose their nodes already.
"""

from __future__ import annotations

from solver.greedy.defragmentation import Defragmentation
from solver.greedy.ledger import Ledger
from solver.instance import Job
from solver.plan import Reason, ReasonCode

UPGRADE_MARGIN = 2.0  # saved run time over the migration's time


class Upgrades:
    def __init__(self, ledger: Ledger, defragmentation: Defragmentation) -> None:
        self.ledger = ledger
        self.defragmentation = defragmentation

    def run(self, avoid: set[int]) -> int:
        """Move what pays, the jobs that would save the most weighted GPU-time first;
        ``avoid``: nodes a backfill reservation holds. Returns how many moved."""
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        ranked: list[tuple[float, str, Job, float, float]] = []
        for job in instance.jobs:
            if not job.migratable or job.id not in state.placement or not self._may_move(job):
                continue
            left = instance.time_left(job)
            if left is None:
                continue
            now = min(ledger.job_speed(job, node) for node in state.placement[job.id])
            size = job.total_gpus
            best = max(
                (
                    state.group_speed(g, job)
                    for g in self._groups(job)
                    if state.group_free[g] >= size
                ),
                default=0.0,
            )  # what it can get now, not what it could gain
            if best <= now:
                continue
            most = ledger.weight[job.id] * job.total_gpus * left * (1.0 - now / best)
            ranked.append((-most, job.id, job, now, left))
        ranked.sort(key=lambda entry: entry[:2])
        budget = ledger.config.max_migrations_per_cycle
        moved = 0
        for _, _, job, now, left in ranked:
            if ledger.migrations >= budget:
                break
            moved += self._try(job, now, left, avoid)
        return moved

    def _try(self, job: Job, now: float, left: float, avoid: set[int]) -> bool:
        """Move ``job`` (running at ``now``, ``left`` seconds of its run to go) onto the
        fastest free GPUs for it, if the time saved pays for the move."""
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        faster = [g for g in self._groups(job) if state.group_speed(g, job) > now]
        if not faster:
            return False
        target = self._target(job, faster, avoid)
        if target is None:
            return False
        speed = min(ledger.job_speed(job, node) for node in target)
        saved = left * (1.0 - now / speed)
        if saved <= UPGRADE_MARGIN * instance.migration.migration_seconds(job):
            return False
        state.evict(job)
        state.place(job, target)
        ledger.migrations += 1
        ledger.touch(job.id)
        names = ",".join(sorted(instance.nodes[node].name for node in target))
        ledger.result.decisions[job.id] = Reason(
            code=ReasonCode.faster_gpus,
            message=f"moved to {names}, where it runs at {speed:.2f} instead of {now:.2f} "
            f"(reference GPU = 1): about {saved / 3600:.1f} h sooner done",
        )
        return True

    def _may_move(self, job: Job) -> bool:
        """A job defragmentation may move, or a gang that spans nodes under the same rules
        (``gang_upgrades``: not an elastic training job, not touched this cycle)."""
        if self.defragmentation.may_move(job.id):
            return True
        ledger = self.ledger
        return (
            ledger.options.gang_upgrades
            and len(job.placement) > 1
            and not job.is_resizable
            and job.id not in ledger.touched
            and self.defragmentation.could_move_whole(job)
        )

    def _target(self, job: Job, faster: list[int], avoid: set[int]) -> dict[int, int] | None:
        """Free GPUs of one faster group for all of ``job`` (node -> GPUs): one node for a
        job on one node, else the fewest nodes within its node limit."""
        state = self.ledger.state
        if len(job.placement) == 1:
            node = state.find_single_node(job, job.replicas, faster, avoid or None)
            return None if node is None else {node: job.total_gpus}
        return state.find_gang(
            job, job.replicas, faster, job.node_limit(job.replicas), avoid or None
        )

    def _groups(self, job: Job) -> list[int]:
        """Where running ``job`` may move up: its own cluster's groups (a move to another
        cluster is the federation's, priced apart)."""
        state = self.ledger.state
        return state.in_cluster_of(state.ready_groups(job), state.placement[job.id])
