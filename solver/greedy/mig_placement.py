"""MIG jobs (``Job.mig_profile``): one GPU instance of a profile each, planned around the rest.

As for shares (``solver.greedy.sharing``, which calls this first), in three steps:

1. :func:`split`: every GPU that running MIG jobs partition becomes one synthetic, locked
   whole-GPU job (a *holder*, with those jobs' CPU and memory) and the MIG jobs leave the
   instance. The rest plans as it always did, and neither a whole-GPU job nor a share can
   land on a partitioned GPU: its holder keeps it.
2. The caller plans the rest (shares included).
3. :meth:`PartitionedGpus.complete`: the pending MIG jobs — overdue first, then by weight,
   then submit time — each get one instance of their profile, on a ready node that accepts
   them (``solver.compat``) and whose GPU model offers the profile, within the node's free
   CPU and memory and their team's quota: on a GPU already partitioned where the profile
   has an open start (the one left with the fewest free compute slices: best fit), else on
   a GPU the plan leaves idle (on the node with the fewest idle GPUs, which keeps whole
   nodes for gangs; its lowest such GPU). The start on the GPU is
   ``solver.mig.best_start``'s: the one that keeps the most larger profiles placeable.
   A job that fits nowhere waits with the reason: no node with its profile
   (``no_compatible_gpu_model``), enough free slices on a GPU but not at a start its
   profile may take (``fragmentation``), or no room (``insufficient_capacity``).

The plan's ``gpu_indices`` name each MIG job's GPU and ``mig_starts`` its first memory slice.

What this does not do (yet): MIG jobs are never moved, preempted or preempt others; they
count as one GPU in team quotas and not at all in the objective; a GPU the plan leaves idle
is taken to be partitionable on demand (MIG mode on, instances created when a job starts);
no reconfiguration is planned (repartitioning a GPU, draining one to change its layout).
An instance without MIG jobs never comes here (its plan is unchanged, byte for byte).
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.compat import node_accepts
from solver.greedy.holders import PlanParts, SplitGpus, holder_jobs, quota_outside
from solver.instance import GpuModel, Instance, Job, Node, NodeState
from solver.mig import COMPUTE_SLICES, GpuLayout, MigProfile, open_starts, place
from solver.plan import Action, ActionKind, Plan, Reason, ReasonCode

HOLDER_PREFIX = "mig-gpu/"  # synthetic holder ids: mig-gpu/<node>/<index>
UNLIMITED = 1 << 60


@dataclass
class PartitionedGpus(SplitGpus):
    """An instance split into the part without MIG jobs (``whole``) and its MIG jobs."""

    def complete(self, plan: Plan) -> Plan:
        """``plan`` (of ``whole``) with the MIG jobs placed: see the module docstring."""
        return _Completion(self, plan).run()


def split(instance: Instance) -> PartitionedGpus | None:
    """The part of ``instance`` without MIG jobs (holders for the GPUs they partition), or
    None when it has no MIG job."""
    if not any(job.mig_profile is not None for job in instance.jobs):
        return None
    partitioned: dict[tuple[str, int], list[Job]] = {}
    kept: list[Job] = []
    for job in instance.jobs:
        where = job.mig_gpu
        if where is not None:
            partitioned.setdefault(where, []).append(job)
        elif not job.is_mig:
            kept.append(job)
    holder_list, holders = holder_jobs(HOLDER_PREFIX, partitioned)
    kept.extend(holder_list)
    whole = instance.model_copy(
        update={"jobs": tuple(kept), "quota_held_outside": quota_outside(instance, partitioned)}
    )
    return PartitionedGpus(instance=instance, whole=whole, holders=holders)


class _Completion:
    def __init__(self, partitioned: PartitionedGpus, plan: Plan) -> None:
        self.partitioned = partitioned
        self.instance = instance = partitioned.instance
        self.plan = plan
        self.layouts = instance.mig_layouts()
        self.position = {node.name: i for i, node in enumerate(instance.nodes)}
        self.cpu = {node.name: node.cpu_milli or UNLIMITED for node in instance.nodes}
        self.mem = {node.name: node.memory_mib or UNLIMITED for node in instance.nodes}
        # team -> GPUs after the plan (with those it holds outside ``instance``)
        self.usage: dict[str, int] = dict(instance.quota_held_outside)
        busy: dict[str, set[int]] = {}
        jobs = partitioned.whole.job_by_id
        for job_id, target in plan.placement.items():
            job = jobs[job_id]
            for node_name, gpus in target.items():
                replicas = gpus // job.gpus_per_replica
                self.cpu[node_name] -= replicas * job.cpu_milli_per_replica
                self.mem[node_name] -= replicas * job.memory_mib_per_replica
            if job_id in partitioned.holders:
                continue
            self.usage[job.team] = self.usage.get(job.team, 0) + sum(target.values())
            for node_name, indices in plan.gpu_indices.get(job_id, {}).items():
                busy.setdefault(node_name, set()).update(indices)
        for job in instance.jobs:
            if job.mig_gpu is not None:
                self.usage[job.team] = self.usage.get(job.team, 0) + 1
        self.idle: dict[str, list[int]] = {}
        for node in instance.nodes:
            taken = busy.get(node.name, set())
            self.idle[node.name] = [
                i for i in range(node.gpus) if i not in taken and (node.name, i) not in self.layouts
            ]
        self.placed: dict[str, tuple[str, int, int]] = {}  # job -> (node, GPU, start)
        self.profiles: dict[tuple[str, str], MigProfile | None] = {}  # (model, profile name)
        self.pending: dict[str, Reason] = {}

    def run(self) -> Plan:
        instance = self.instance
        queue = sorted(
            (job for job in instance.jobs if job.is_mig and not job.is_running),
            key=lambda job: (
                not instance.is_overdue(job),
                -instance.weight(job),
                job.submit_time,
                job.id,
            ),
        )
        for job in queue:
            frozen = instance.frozen_because(job)
            if frozen is not None:
                self.pending[job.id] = Reason(code=ReasonCode.dwell, message=frozen)
                continue
            cap = instance.policy_for(job).quota_cap
            if cap is not None and self.usage.get(job.team, 0) + 1 > cap:
                self.pending[job.id] = Reason(
                    code=ReasonCode.quota, message=f"team {job.team} is at its quota of {cap} GPUs"
                )
                continue
            if not self._start(job):
                self.pending[job.id] = self._why_not(job)
        return self._plan()

    def _profile(self, node: Node, job: Job) -> MigProfile | None:
        """The job's profile on ``node``'s GPU model, or None if the model lacks it."""
        assert job.mig_profile is not None
        key = (node.gpu_model, job.mig_profile)
        if key not in self.profiles:
            self.profiles[key] = self._model(node).mig_profile(job.mig_profile)
        return self.profiles[key]

    def _model(self, node: Node) -> GpuModel:
        return self.instance.model_by_name[node.gpu_model]

    def _accepts(self, node: Node, job: Job) -> bool:
        return (
            node.state is NodeState.up
            and self.cpu[node.name] >= job.cpu_milli_per_replica
            and self.mem[node.name] >= job.memory_mib_per_replica
            and node_accepts(self.instance, node, job)
        )

    def _start(self, job: Job) -> bool:
        """Put ``job`` on the best GPU (see the module docstring); True when placed."""
        nodes = self.instance.node_by_name
        best: tuple[int, int, int, str] | None = None  # free compute after, node, GPU
        for (node_name, gpu), layout in self.layouts.items():
            if layout.used_compute == COMPUTE_SLICES:
                continue  # full: most of them, once MIG jobs pile up
            node = nodes[node_name]
            profile = self._profile(node, job)
            if profile is None or not open_starts(layout, profile):
                continue
            if not self._accepts(node, job):
                continue
            left = layout.free_compute_slices - profile.compute_slices
            key = (left, self.position[node_name], gpu, node_name)
            if best is None or key < best:
                best = key
        if best is not None:
            self._place(job, best[3], best[2])
            return True
        chosen: tuple[int, int, str] | None = None  # idle GPUs, node position
        for node in self.instance.nodes:
            idle = self.idle[node.name]
            if not idle or self._profile(node, job) is None or not self._accepts(node, job):
                continue
            fewest = (len(idle), self.position[node.name], node.name)
            if chosen is None or fewest < chosen:
                chosen = fewest
        if chosen is None:
            return False
        node_name = chosen[2]
        gpu = self.idle[node_name].pop(0)
        table = self._model(nodes[node_name]).mig_profiles
        self.layouts[node_name, gpu] = GpuLayout(table)
        self._place(job, node_name, gpu)
        return True

    def _place(self, job: Job, node_name: str, gpu: int) -> None:
        layout = self.layouts[node_name, gpu]
        profile = self._profile(self.instance.node_by_name[node_name], job)
        assert profile is not None
        start = place(layout, profile, job.id)
        assert start is not None
        self.cpu[node_name] -= job.cpu_milli_per_replica
        self.mem[node_name] -= job.memory_mib_per_replica
        self.usage[job.team] = self.usage.get(job.team, 0) + 1
        self.placed[job.id] = (node_name, gpu, start)

    def _why_not(self, job: Job) -> Reason:
        name = job.mig_profile
        nodes = [
            node
            for node in self.instance.nodes
            if self._profile(node, job) is not None and node_accepts(self.instance, node, job)
        ]
        if not nodes:
            return Reason(
                code=ReasonCode.no_compatible_gpu_model,
                message=f"no node that accepts it has a GPU model with MIG profile {name}",
            )
        accepting = {node.name: node for node in nodes if self._accepts(node, job)}
        blocked: list[str] = []
        starts: list[int] = []
        for (node_name, gpu), layout in self.layouts.items():
            node = accepting.get(node_name)
            profile = None if node is None else self._profile(node, job)
            if profile is None:
                continue
            if (
                layout.free_memory_slices >= profile.memory_slices
                and layout.free_compute_slices >= profile.compute_slices
            ):
                held = ", ".join(s.describe() for s in layout.slices)
                blocked.append(f"GPU {gpu} of {node_name} holds {held}")
                starts = list(profile.starts)
        if blocked:
            return Reason(
                code=ReasonCode.fragmentation,
                message=f"{len(blocked)} partitioned GPU(s) have the slices a {name} needs free, "
                f"but not at a start it may take (memory slice {starts}): {blocked[0]}",
            )
        return Reason(
            code=ReasonCode.insufficient_capacity,
            message=f"no idle GPU and no partitioned GPU with room for a {name} on a ready "
            "node that accepts it",
        )

    def _plan(self) -> Plan:
        parts = PlanParts.without_holders(self.plan, self.partitioned.holders)
        placement, indices, pending = parts.placement, parts.indices, parts.pending
        starts: dict[str, int] = {}
        for job in self.instance.jobs:
            if not job.is_mig:
                continue
            where = job.mig_gpu
            if where is not None and job.mig_start is not None:
                placement[job.id] = dict(job.placement)
                indices[job.id] = {where[0]: (where[1],)}
                starts[job.id] = job.mig_start
            elif job.id in self.placed:
                node_name, gpu, start = self.placed[job.id]
                placement[job.id] = {node_name: 1}
                indices[job.id] = {node_name: (gpu,)}
                starts[job.id] = start
                layout = self.layouts[node_name, gpu]
                held = next(s for s in layout.slices if s.owner == job.id)
                parts.actions.append(
                    Action(
                        kind=ActionKind.start,
                        job_id=job.id,
                        to_placement={node_name: 1},
                        reason=Reason(
                            code=ReasonCode.placed,
                            message=f"{held.describe()} of GPU {gpu} on {node_name}",
                        ),
                    )
                )
            else:
                pending[job.id] = self.pending[job.id]
        return parts.plan(f"MIG jobs: {len(self.placed)} placed", mig_starts=starts)
