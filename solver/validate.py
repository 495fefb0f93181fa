"""Solver-agnostic check of every hard constraint; used before dispatch and in tests.

It reads only the instance and the plan (never an engine's internals), so a plan from any
engine, a hand edit or a JSON fixture is checked the same way. Rules, in order:

1. references: jobs, nodes exist; GPUs per node a positive multiple of gpus_per_replica;
2. capacity: GPUs, CPU and memory per node (a node the snapshot already overfills may
   not get fuller);
3. compatibility: GPUs a job gains on a node satisfy model, memory, precision, selectors,
   taints, allowed clusters, and the node is ready;
4. gangs: a block job holds all ``replicas × gpus_per_replica`` GPUs or none (an elastic
   training job, ``Job.is_resizable``: between ``min_replicas`` and ``max_replicas``
   replicas), within one cluster, on at most ``max_nodes`` nodes (``Job.node_limit``: more
   for an elastic training job grown past its ask, which may shrink on the nodes it holds),
   one replica per node for a job of ``Instance.one_replica_per_node``;
5. movement: a non-checkpointable running job keeps its placement or stops; a running
   job whose size changes (an elastic training job's resize: a checkpoint and a restart
   where the plan puts it, not a migration) is checkpointable and stays in its cluster; a moved job
   stays in its cluster unless its ``clusters`` lists the other one (a federation group's
   plan: ``solver.federation.federate``), and then goes from one node to one node (the
   move's saga checkpoints one node and stages on one); a job that is not ``migratable``
   (its scheduler cannot be told where it goes) does not move within its cluster, not
   even to another GPU of its node; a moved job respects the per-cycle
   budget, the cooldown and its SLA's migrations per day;
6. stopping: a stopped job is preemptible, under its preemptions per day, within the
   per-cycle preemption cap, and no team loses GPUs within its guarantee to others;
7. elastic: between min and max replicas (never pushed below min from where it was),
   changed by at most ``max_replica_change`` replicas;
8. quota: a team's GPUs stay within guaranteed + borrowing limit (or do not grow);
9. bookkeeping: one action per changed job, of the right kind, matching the placement;
   a reason for every job that holds nothing; GPU indices, where given, distinct per node,
   in range, as many as the placement says;
   fractional jobs (``Job.gpu_milli`` < 1000): each names its one GPU in ``gpu_indices``,
   a GPU's shares add up to at most 1000 and it counts once in rule 2, no whole-GPU job
   holds a shared GPU, and a move to another GPU of the same node is a migration;
   MIG jobs (``Job.mig_profile``): each names its one GPU in ``gpu_indices`` and its start
   in ``mig_starts``, its node's GPU model has the profile, the start is one the profile
   may take (``solver.mig``), a GPU's instances do not overlap (nor pass 7 compute
   slices) and it counts once in rule 2, no whole-GPU job or share holds a partitioned
   GPU, and another GPU or start is a migration;
10. max queue wait: no pending block job past its SLA's max queue wait is left pending
    while it fits, whole (an elastic training job at the size it asks; not a gang of
    ``Instance.one_replica_per_node``, which never fits one node), on one ready
    compatible node's GPUs, CPU and memory that the plan leaves free, within its team's
    quota (a frozen one excepted: a saga holds it);
11. dwell: a frozen job (``Instance.is_frozen``: Shaper acted on it within the dwell time,
    its move budget for the hour is spent, or a saga is acting on it) keeps exactly the
    placement it has — a running one is not moved, resized, preempted or requeued, a
    pending one is not started.

Rule 10 is the checkable part of "an overdue job must be placed if any legal plan places
it": starting such a job on what the plan leaves free changes nothing else, so the plan
with that start is legal too and places more overdue work. The full rule (could some
*other* legal plan, with other starts, preemptions or moves, place it?) is a search
problem, not a check; the engines enforce it as far as they can (``solver.greedy`` places
overdue jobs first and preempts for them, ``solver.overdue_pass`` makes the CP-SAT
model place as many overdue jobs as any solution of it can). A gang that would fit only
across several nodes' leftovers is not flagged either: the check stays a single-node one
so that it never rejects a plan an engine could not have improved by a plain start.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from solver.compat import node_accepts
from solver.instance import FULL_GPU_MILLI, Instance, Job, NodeState
from solver.mig import MigSlice, clash
from solver.plan import ActionKind, Plan


@dataclass(frozen=True)
class Violation:
    rule: str
    job_id: str | None
    message: str

    def __str__(self) -> str:
        where = f" [{self.job_id}]" if self.job_id else ""
        return f"{self.rule}{where}: {self.message}"


class PlanInvalid(Exception):
    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        listed = "; ".join(str(v) for v in violations[:10])
        super().__init__(f"{len(violations)} violation(s): {listed}")


def check(instance: Instance, plan: Plan) -> None:
    """Raise :class:`PlanInvalid` if ``plan`` breaks any hard constraint."""
    violations = validate(instance, plan)
    if violations:
        raise PlanInvalid(violations)


def validate(instance: Instance, plan: Plan) -> list[Violation]:
    out: list[Violation] = []
    config = instance.config
    nodes = instance.node_by_name
    jobs = instance.job_by_id

    def bad(rule: str, job_id: str | None, message: str) -> None:
        out.append(Violation(rule, job_id, message))

    # 1. references
    for job_id, target in plan.placement.items():
        job = jobs.get(job_id)
        if job is None:
            bad("reference", job_id, "unknown job")
            continue
        for node_name, gpus in target.items():
            if node_name not in nodes:
                bad("reference", job_id, f"unknown node {node_name}")
            elif gpus <= 0 or gpus % job.gpus_per_replica:
                bad("reference", job_id, f"{gpus} GPUs on {node_name} is not whole replicas")
    if out:
        return out

    # 2. capacity
    gpu_used: dict[str, int] = defaultdict(int)
    cpu_used: dict[str, int] = defaultdict(int)
    mem_used: dict[str, int] = defaultdict(int)
    # Fractional jobs: a GPU they share counts once, however many share it.
    shares = _Shares(instance, plan, bad) if _has_fractional(instance) else None
    # MIG jobs: a GPU they partition counts once too.
    migs = _MigSlices(instance, plan, shares, bad) if _has_mig(instance, plan) else None
    if out:
        return out
    for job_id, target in plan.placement.items():
        job = jobs[job_id]
        for node_name, gpus in target.items():
            replicas = gpus // job.gpus_per_replica
            if not (job.is_fractional or job.is_mig):
                gpu_used[node_name] += gpus
            cpu_used[node_name] += replicas * job.cpu_milli_per_replica
            mem_used[node_name] += replicas * job.memory_mib_per_replica
    # A snapshot may already be over capacity (stale telemetry): a plan must not add to it.
    gpu_before: dict[str, int] = defaultdict(int)
    cpu_before: dict[str, int] = defaultdict(int)
    mem_before: dict[str, int] = defaultdict(int)
    if shares is not None:
        for (node_name, _), _milli in shares.after.items():
            gpu_used[node_name] += 1
        for (node_name, _), _milli in shares.before.items():
            gpu_before[node_name] += 1
    if migs is not None:
        for node_name, _ in migs.after:
            gpu_used[node_name] += 1
        for node_name, _ in migs.before:
            gpu_before[node_name] += 1
    for job in instance.jobs:
        for node_name, gpus in job.placement.items():
            replicas = gpus // job.gpus_per_replica
            if not (job.is_fractional or job.is_mig):
                gpu_before[node_name] += gpus
            cpu_before[node_name] += replicas * job.cpu_milli_per_replica
            mem_before[node_name] += replicas * job.memory_mib_per_replica
    for node_name, used in gpu_used.items():
        node = nodes[node_name]
        if used > max(node.gpus, gpu_before[node_name]):
            bad("capacity", None, f"{node_name}: {used} GPUs > {node.gpus}")
        cpu = cpu_used[node_name]
        if node.cpu_milli and cpu > max(node.cpu_milli, cpu_before[node_name]):
            bad("capacity", None, f"{node_name}: {cpu} mCPU > {node.cpu_milli}")
        mem = mem_used[node_name]
        if node.memory_mib and mem > max(node.memory_mib, mem_before[node_name]):
            bad("capacity", None, f"{node_name}: {mem} MiB > {node.memory_mib}")

    migrations = 0
    preemptions = 0
    stopped_by_team: dict[str, int] = defaultdict(int)
    started_by_team: dict[str, int] = defaultdict(int)
    usage_before: dict[str, int] = defaultdict(int)
    usage_after: dict[str, int] = defaultdict(int)
    for team, gpus in instance.quota_held_outside.items():
        usage_before[team] += gpus  # shares and MIG instances planned around this part
        usage_after[team] += gpus
    for job in instance.jobs:
        before = job.placement
        after = plan.placement.get(job.id, {})
        usage_before[job.team] += sum(before.values())
        usage_after[job.team] += sum(after.values())
        moved_gpu = (shares is not None and job.id in shares.moved) or (
            migs is not None and job.id in migs.moved
        )
        if after == before and not job.is_elastic and not moved_gpu:
            continue  # a block job the plan leaves as it is: rules 3-6 hold (most jobs)
        policy = instance.policy_for(job)

        # 3. compatibility of what the job gains
        for node_name, gpus in after.items():
            if gpus > before.get(node_name, 0):
                node = nodes[node_name]
                if node.state is not NodeState.up:
                    bad("compatibility", job.id, f"{node_name} is {node.state.value}")
                if not node_accepts(instance, node, job):
                    bad("compatibility", job.id, f"{node_name} ({node.gpu_model}) not allowed")

        if job.is_elastic:
            # 7. elastic bounds
            replicas = sum(after.values()) // job.gpus_per_replica
            floor = min(job.min_replicas, job.held_gpus // job.gpus_per_replica)
            if replicas < floor:
                bad("elastic", job.id, f"{replicas} replicas < min {job.min_replicas}")
            current = job.held_gpus // job.gpus_per_replica
            if replicas > job.upper_replicas and replicas > current:
                bad("elastic", job.id, f"{replicas} replicas > max {job.upper_replicas}")
            step = job.max_replica_change
            if step is not None and abs(replicas - current) > step:
                bad("elastic", job.id, f"{current} -> {replicas} replicas, more than {step}")
            if before != after:
                started_by_team[job.team] += max(0, sum(after.values()) - sum(before.values()))
            continue

        # 4. gangs
        resized = bool(before) and bool(after) and sum(after.values()) != sum(before.values())
        if after != before and after:
            total = sum(after.values())
            if job.is_resizable:
                per = job.gpus_per_replica
                if not job.min_replicas * per <= total <= (job.max_replicas or 0) * per:
                    bad(
                        "gang",
                        job.id,
                        f"holds {total // per} replicas, outside "
                        f"{job.min_replicas}..{job.max_replicas}",
                    )
            elif total != job.total_gpus:
                bad("gang", job.id, f"holds {total} GPUs, needs {job.total_gpus}")
            if len({nodes[n].cluster for n in after}) > 1:
                bad("gang", job.id, "spans clusters")
            limit = job.node_limit(total // job.gpus_per_replica)
            shrunk_in_place = job.is_resizable and set(after) <= set(before)
            if limit is not None and len(after) > limit and not shrunk_in_place:
                bad("gang", job.id, f"{len(after)} nodes > max_nodes {limit}")
            if job.id in instance.one_replica_per_node:
                crowded = sorted(n for n, g in after.items() if g > job.gpus_per_replica)
                if crowded:
                    bad("gang", job.id, f"more than one replica on {', '.join(crowded)}")
        if not before and after:
            started_by_team[job.team] += sum(after.values())

        # 5. movement (a resize restarts the job where the plan puts it: not a migration)
        if resized and not job.checkpointable:
            bad("elastic training", job.id, "resized without a checkpoint to restart from")
        if resized and {nodes[n].cluster for n in after} != {nodes[n].cluster for n in before}:
            bad("elastic training", job.id, "resized into another cluster")
        if before and after and not resized and (after != before or moved_gpu):
            migrations += 1
            if not job.checkpointable:
                bad("movement", job.id, "non-checkpointable job moved")
            there = {nodes[n].cluster for n in after}
            if there != {nodes[n].cluster for n in before}:
                if job.clusters is None or not there <= job.clusters:
                    bad("movement", job.id, "moved to another cluster, not in its clusters")
                elif len(before) != 1 or len(after) != 1:
                    bad("movement", job.id, "moved to another cluster off or onto several nodes")
            elif not job.migratable:
                bad(
                    "movement",
                    job.id,
                    "moved within its cluster, whose scheduler cannot be told where it goes "
                    "(not migratable)",
                )
            if (
                job.last_moved_at is not None
                and instance.now - job.last_moved_at < config.migration_cooldown_s
            ):
                bad("movement", job.id, "moved again within the cooldown")
            limit = policy.max_migrations_per_day
            if limit is not None and job.migrations_today >= limit:
                bad("movement", job.id, f"over {limit} migrations per day")

        # 6. stopping
        if before and not after:
            preemptions += 1
            stopped_by_team[job.team] += sum(before.values())
            if not instance.is_preemptible(job):
                bad("preemption", job.id, "job is not preemptible")
            limit = policy.max_preemptions_per_day
            if limit is not None and job.preemptions_today >= limit:
                bad("preemption", job.id, f"over {limit} preemptions per day")

    if migrations > config.max_migrations_per_cycle:
        bad("movement", None, f"{migrations} migrations > {config.max_migrations_per_cycle}")
    cap = config.max_preemptions_per_cycle
    if cap is not None and preemptions > cap:
        bad("preemption", None, f"{preemptions} preemptions > {cap} per cycle")

    teams = set(usage_before) | set(usage_after)
    for team in sorted(teams):
        team_policy = instance.policy_by_team.get(team)
        guaranteed = team_policy.guaranteed_gpus if team_policy is not None else 0
        reclaimable = max(0, usage_before[team] - guaranteed) + started_by_team[team]
        if stopped_by_team[team] > reclaimable:
            bad(
                "guarantee",
                None,
                f"team {team}: {stopped_by_team[team]} GPUs stopped within its guarantee",
            )
        # 8. quota
        quota_cap = team_policy.quota_cap if team_policy is not None else None
        if quota_cap is not None and usage_after[team] > max(quota_cap, usage_before[team]):
            bad("quota", None, f"team {team}: {usage_after[team]} GPUs > quota {quota_cap}")

    # 9. bookkeeping
    acted: dict[str, int] = defaultdict(int)
    for action in plan.actions:
        job = jobs.get(action.job_id)
        if job is None:
            bad("actions", action.job_id, "action for an unknown job")
            continue
        acted[job.id] += 1
        after = plan.placement.get(job.id, {})
        if action.from_placement != job.placement or action.to_placement != after:
            bad("actions", job.id, f"{action.kind.value} does not match the placement")
        resized = bool(job.placement) and bool(after) and job.is_resizable
        resized = resized and sum(after.values()) != job.held_gpus
        expected = _expected_kind(bool(job.placement), bool(after), job.is_elastic or resized)
        if action.kind not in expected:
            bad("actions", job.id, f"{action.kind.value} where {expected} expected")
    for job in instance.jobs:
        after = plan.placement.get(job.id, {})
        count = acted.get(job.id, 0)
        changed = (
            after != job.placement
            or (shares is not None and job.id in shares.moved)
            or (migs is not None and job.id in migs.moved)
        )
        if changed and count != 1:
            bad("actions", job.id, f"changed with {count} actions")
        if not changed and count:
            bad("actions", job.id, "action for an unchanged job")
        if not after and not job.is_elastic and job.id not in plan.pending:
            bad("reasons", job.id, "holds nothing and has no reason")

    # 10. max queue wait
    for job in instance.jobs:
        if job.is_elastic or job.is_running or job.id in plan.placement:
            continue
        if not instance.is_overdue(job) or instance.is_frozen(job):
            continue
        if job.replicas > 1 and job.id in instance.one_replica_per_node:
            continue  # never on one node
        quota_cap = instance.policy_for(job).quota_cap
        if quota_cap is not None and usage_after[job.team] + job.total_gpus > quota_cap:
            continue
        for node in instance.nodes:
            if node.state is not NodeState.up or not node_accepts(instance, node, job):
                continue
            if job.mig_profile is not None:
                if instance.model_by_name[node.gpu_model].mig_profile(job.mig_profile) is None:
                    continue  # fits on an idle GPU only where the model has its profile
            if node.gpus - gpu_used[node.name] < job.total_gpus:
                continue
            cpu = job.replicas * job.cpu_milli_per_replica
            if node.cpu_milli and node.cpu_milli - cpu_used[node.name] < cpu:
                continue
            mem = job.replicas * job.memory_mib_per_replica
            if node.memory_mib and node.memory_mib - mem_used[node.name] < mem:
                continue
            bad(
                "overdue",
                job.id,
                f"past its max queue wait and left pending, but fits on {node.name}'s free GPUs",
            )
            break

    # 11. dwell
    for job_id in sorted(instance.frozen_ids):
        job = jobs[job_id]
        after = plan.placement.get(job_id, {})
        if after != job.placement:
            change = "started" if not job.placement else "stopped" if not after else "moved"
            if job.is_elastic or (job.placement and after and sum(after.values()) != job.held_gpus):
                change = "resized"
            bad("dwell", job_id, f"{change} while frozen: {instance.frozen_because(job)}")

    if plan.gpu_indices and not out:  # indices follow the placement: check them last
        _check_indices(instance, plan, bad)
    return out


def _has_fractional(instance: Instance) -> bool:
    return any(job.is_fractional for job in instance.jobs)


def _has_mig(instance: Instance, plan: Plan) -> bool:
    return bool(plan.mig_starts) or any(job.mig_profile is not None for job in instance.jobs)


class _Shares:
    """The GPUs fractional jobs share before and after a plan: milli per (node, index),
    and the jobs the plan moves to another GPU of the same node. Reports a fractional job
    placed without its one GPU index, on a GPU out of range, or a GPU shared past 1000."""

    def __init__(
        self, instance: Instance, plan: Plan, bad: Callable[[str, str | None, str], None]
    ) -> None:
        self.before: dict[tuple[str, int], int] = defaultdict(int)
        self.after: dict[tuple[str, int], int] = defaultdict(int)
        self.moved: set[str] = set()
        nodes = instance.node_by_name
        for job in instance.jobs:
            if not job.is_fractional:
                continue
            was = job.shared_gpu
            if was is not None:
                self.before[was] += job.gpu_milli
            target = plan.placement.get(job.id, {})
            if not target:
                continue
            if len(target) != 1:
                bad("gang", job.id, f"a fractional job on {len(target)} nodes, not one")
                continue
            (node_name,) = target
            indices = plan.gpu_indices.get(job.id, {}).get(node_name, ())
            if len(indices) != 1 or not 0 <= indices[0] < nodes[node_name].gpus:
                message = f"{node_name}: a fractional job needs one GPU index, not {indices}"
                bad("indices", job.id, message)
                continue
            where = (node_name, indices[0])
            self.after[where] += job.gpu_milli
            if was is not None and was != where:
                self.moved.add(job.id)
        for (node_name, index), milli in sorted(self.after.items()):
            if milli > max(FULL_GPU_MILLI, self.before.get((node_name, index), 0)):
                bad(
                    "capacity",
                    None,
                    f"{node_name}: GPU {index} shared by {milli} gpu_milli > {FULL_GPU_MILLI}",
                )


class _MigSlices:
    """The GPUs MIG jobs partition before and after a plan, and the jobs the plan gives
    another GPU or start. Reports a MIG job without its one GPU index or its start, a
    profile its node's GPU model lacks, a start its profile may not take, instances that
    overlap, and a whole-GPU job or a share on a partitioned GPU."""

    def __init__(
        self,
        instance: Instance,
        plan: Plan,
        shares: _Shares | None,
        bad: Callable[[str, str | None, str], None],
    ) -> None:
        self.before: set[tuple[str, int]] = set()
        self.after: dict[tuple[str, int], list[MigSlice]] = defaultdict(list)
        self.moved: set[str] = set()
        jobs = instance.job_by_id
        for job_id in plan.mig_starts:
            job = jobs.get(job_id)
            if job is None or not job.is_mig or job_id not in plan.placement:
                bad("mig", job_id, "mig_starts names a job that is not a placed MIG job")
        for job in instance.jobs:
            if job.mig_profile is None:
                continue
            was = job.mig_gpu
            if was is not None:
                self.before.add(was)
            target = plan.placement.get(job.id, {})
            if target:
                self._slice(instance, plan, job, job.mig_profile, target, bad)
        for (node_name, index), held in sorted(self.after.items()):
            owners = ", ".join(s.owner for s in held)
            if shares is not None and (node_name, index) in shares.after:
                message = f"GPU {index} of {node_name} is both shared and partitioned ({owners})"
                bad("capacity", None, message)
        for job_id in plan.placement:
            job = jobs[job_id]
            if job.is_mig or job.is_fractional:
                continue
            for node_name, indices in plan.gpu_indices.get(job_id, {}).items():
                for index in indices:
                    if (node_name, index) in self.after:
                        owners = ", ".join(s.owner for s in self.after[node_name, index])
                        bad(
                            "mig",
                            job_id,
                            f"holds GPU {index} of {node_name}, which MIG slices partition "
                            f"({owners})",
                        )

    def _slice(
        self,
        instance: Instance,
        plan: Plan,
        job: Job,
        profile_name: str,
        target: dict[str, int],
        bad: Callable[[str, str | None, str], None],
    ) -> None:
        if len(target) != 1:
            bad("gang", job.id, f"a MIG job on {len(target)} nodes, not one")
            return
        (node_name,) = target
        node = instance.node_by_name[node_name]
        indices = plan.gpu_indices.get(job.id, {}).get(node_name, ())
        if len(indices) != 1 or not 0 <= indices[0] < node.gpus:
            bad("indices", job.id, f"{node_name}: a MIG job needs one GPU index, not {indices}")
            return
        start = plan.mig_starts.get(job.id)
        if start is None:
            bad("mig", job.id, "placed without its start in mig_starts")
            return
        model = instance.model_by_name[node.gpu_model]
        profile = model.mig_profile(profile_name)
        if profile is None:
            bad("mig", job.id, f"{node_name} ({model.name}) has no MIG profile {profile_name}")
            return
        if start not in profile.starts:
            bad(
                "mig",
                job.id,
                f"{profile_name} may not start at memory slice {start} "
                f"(only at {list(profile.starts)})",
            )
            return
        where = (node_name, indices[0])
        new = MigSlice(job.id, profile, start)
        why = clash(self.after[where], new)
        if why is not None:
            bad("mig", job.id, f"{new.describe()} of GPU {where[1]} on {node_name} {why}")
        self.after[where].append(new)
        if job.mig_gpu is not None and (job.mig_gpu != where or job.mig_start != start):
            self.moved.add(job.id)


def _check_indices(
    instance: Instance, plan: Plan, bad: Callable[[str, str | None, str], None]
) -> None:
    taken: dict[str, set[int]] = defaultdict(set)
    overfull: dict[str, int] = defaultdict(int)
    node_by_name = instance.node_by_name
    jobs = instance.job_by_id
    shared: dict[str, set[int]] = defaultdict(set)
    for job_id, target in plan.placement.items():
        if jobs[job_id].is_fractional or jobs[job_id].is_mig:
            for node_name, gpu in plan.gpu_indices.get(job_id, {}).items():
                shared[node_name].update(gpu)
            continue
        for node_name, gpus in target.items():
            overfull[node_name] += gpus
    for node_name, shared_here in shared.items():
        overfull[node_name] += len(shared_here)
    for job_id, target in plan.placement.items():
        if jobs[job_id].is_fractional or jobs[job_id].is_mig:
            continue  # checked by _Shares or _MigSlices; against the whole GPUs below
        held = plan.gpu_indices.get(job_id, {})
        for node_name, gpus in target.items():
            indices = held.get(node_name, ())
            size = node_by_name[node_name].gpus
            if overfull[node_name] > size:
                continue  # an overfilled snapshot has no consistent indices to check
            distinct = set(indices)  # once per holder: a plan has one per running job
            in_range = not distinct or (min(distinct) >= 0 and max(distinct) < size)
            if len(distinct) != gpus or not in_range:
                bad("indices", job_id, f"{node_name}: indices {indices} for {gpus} GPUs")
            taken_here = taken[node_name]
            if not taken_here.isdisjoint(distinct) or not shared[node_name].isdisjoint(distinct):
                bad("indices", job_id, f"{node_name}: indices {indices} already taken")
            taken_here |= distinct


def _expected_kind(before: bool, after: bool, elastic: bool) -> set[ActionKind]:
    if elastic:
        return {ActionKind.resize}
    if not before:
        return {ActionKind.start}
    if not after:
        return {ActionKind.preempt, ActionKind.requeue}
    return {ActionKind.migrate}
