"""Whether a plan still applies to the cluster as it is now: the check that keeps proposals
stable and expires them only for a reason.

A plan's actions that have not started yet (``proposed``, or ``approved`` and waiting for
their prerequisites) still apply while:

1. every job they act on still exists and is where the plan found it: a start's or a
   reservation's job still pending, a migration's, preemption's, requeue's or resize's job
   still holding exactly the GPUs the plan took from it (``source_placement``) — or, for a
   job's later action in the plan (a moved service's growth back), those an earlier live
   or done action of the job starts from, or, once that one runs, any step on its way
   (a done one's effect may not be in the telemetry yet);
2. every node they put work on is still ``up``;
3. on every such node, the GPUs free now plus those the plan's unfinished actions will
   still free cover what its unfinished actions will still take: nobody outside the plan
   took GPUs the plan counts on.

Nothing else counts as a material change here: telemetry pushes, demand samples, jobs
arriving or ending elsewhere leave a plan standing (the cycle may still replace it with
a plan worth clearly more: ``app.shaping.cycle``). Actions are checked by dependency
component — the actions that need each other's GPUs — and a component that fails any
check expires whole, its undecided actions ``cancelled``, while those already running go
on. Each reason names the job or node that changed, and the action that failed a check
is told apart from those that only fall with it (``Review.failing``): a start whose job
is still pending can expire because the job its plan would have preempted ended on its
own meanwhile, and its reason must say so rather than read as if its own job had ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.actions import service as action_service
from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind, ActionState
from app.core.lookup import row_id
from app.shaping.snapshot import ClusterSnapshot, JobRow
from solver.dependencies import gpu_changes

# Not started yet: these can still be withdrawn when the plan no longer applies.
UNSTARTED = (ActionState.proposed, ActionState.approved)


@dataclass
class Review:
    # action id -> why it no longer applies, for every unstarted action of a component
    # that fails a check: its own reason, or the reason of the component's first failing
    # action, which it falls with.
    expired: dict[int, str] = field(default_factory=dict)
    # The actions that fail a check themselves, in id order, with their own reasons: the
    # ones to withdraw first, so the rest of their component falls naming them.
    failing: dict[int, str] = field(default_factory=dict)


def held_by_job(row: JobRow) -> dict[str, int]:
    held: dict[str, int] = {}
    for node, _indices, gpus in row.placement:
        held[node] = held.get(node, 0) + gpus
    return held


def _job_check(
    action: Action,
    row: JobRow | None,
    name: str | None,
    earlier: list[Action] | None = None,
) -> str | None:
    if row is None:
        # Only live jobs are in the snapshot: the job has ended, or vanished from the
        # scheduler's view (telemetry marks such a job finished). Named, since the reason
        # is also written on the actions that fall with this one.
        return f"job {name} has ended or left the cluster" if name else "its job is gone"
    held = held_by_job(row)
    kind = ActionKind(action.kind)
    if kind is ActionKind.reserve:
        return None  # it applies while the move or start it holds GPUs for applies
    if kind is ActionKind.start:
        if held and held != action.target_placement:
            return f"job {row.external_id} already runs on {','.join(sorted(held))}"
        return None
    if held != action.source_placement and not any(_on_its_way(a, held) for a in earlier or []):
        now = ",".join(f"{n}:{g}" for n, g in sorted(held.items())) or "no GPUs"
        then = ",".join(f"{n}:{g}" for n, g in sorted(action.source_placement.items()))
        return f"job {row.external_id} now holds {now}; the plan found it on {then or 'none'}"
    return None


def _on_its_way(earlier: Action, held: dict[str, int]) -> bool:
    """Whether ``held`` is where an earlier live or done action of the job leaves it for
    now: its start (``source_placement``), or, once it runs, anything between its start
    and its target on every node (a shrink under way: Kubernetes deletes the chosen pods
    one by one; or done, before the connector's next push shows it)."""
    source, target = earlier.source_placement, earlier.target_placement
    if held == source:
        return True
    if ActionState(earlier.state) in UNSTARTED:
        return False
    return all(
        min(source.get(n, 0), target.get(n, 0))
        <= held.get(n, 0)
        <= max(source.get(n, 0), target.get(n, 0))
        for n in set(source) | set(target) | set(held)
    )


def _still_to_free(action: Action, held: Mapping[str, int]) -> dict[str, int]:
    """GPUs an action frees on each node that its job, as the snapshot has it, still holds
    there beyond what the action keeps."""
    changes = gpu_changes(action.source_placement, action.target_placement)
    return {
        node: held.get(node, 0) - action.target_placement.get(node, 0)
        for node, change in changes.items()
        if change < 0 and held.get(node, 0) > action.target_placement.get(node, 0)
    }


def review_plan(
    snapshot: ClusterSnapshot, actions: list[Action], *, job_names: Mapping[int, str] | None = None
) -> Review:
    """Which of a plan's unstarted actions no longer apply, and why. ``job_names``: the
    external id of each job the actions act on (the snapshot holds live jobs only, so a
    job that has ended is named from here)."""
    review = Review()
    jobs = snapshot.job_by_id
    nodes = {node.name: node for node in snapshot.nodes}
    held_now = {node.name: 0 for node in snapshot.nodes}
    for job in snapshot.jobs:
        for node, gpus in held_by_job(job).items():
            held_now[node] = held_now.get(node, 0) + gpus
    # What the plan's unfinished actions will still take and free, per node.
    live = [a for a in actions if ActionState(a.state) not in TERMINAL_ACTION_STATES]
    # Done, but perhaps not yet in the snapshot: a resize's success records nothing, so a
    # service shrunk off a node still holds its GPUs there until its connector's next push
    # (a move's shrink whose start and growth back a cycle must not expire meanwhile).
    done = [a for a in actions if ActionState(a.state) is ActionState.succeeded]
    need: dict[str, int] = {}
    freed: dict[str, int] = {}
    takers: dict[str, list[Action]] = {}
    for action in live:
        if ActionKind(action.kind) in (ActionKind.reserve, ActionKind.unreserve):
            continue
        row = jobs.get(action.job_id) if action.job_id is not None else None
        held = held_by_job(row) if row is not None else {}
        for node, change in gpu_changes(action.source_placement, action.target_placement).items():
            if change > 0:
                still = max(0, action.target_placement.get(node, 0) - held.get(node, 0))
                need[node] = need.get(node, 0) + still
                if ActionState(action.state) in UNSTARTED:
                    takers.setdefault(node, []).append(action)
        for node, gpus in _still_to_free(action, held).items():
            freed[node] = freed.get(node, 0) + gpus
    for action in done:  # GPUs it freed that the snapshot still shows held
        if ActionKind(action.kind) in (ActionKind.reserve, ActionKind.unreserve):
            continue
        row = jobs.get(action.job_id) if action.job_id is not None else None
        for node, gpus in _still_to_free(action, held_by_job(row) if row else {}).items():
            freed[node] = freed.get(node, 0) + gpus
    why: dict[int, str] = {}
    for node, node_takers in takers.items():
        info = nodes.get(node)
        if info is None or info.state != "up":
            state = "gone" if info is None else info.state
            for action in node_takers:
                why.setdefault(row_id(action), f"node {node} is {state}")
            continue
        available = info.gpu_count - held_now.get(node, 0) + freed.get(node, 0)
        if need.get(node, 0) > available:
            planned = {a.job_id for a in live}
            others = sorted(
                row.external_id
                for row in snapshot.jobs
                if row.id not in planned and node in held_by_job(row)
            )
            message = (
                f"GPUs on {node} the plan counts on are taken "
                f"({need[node]} needed, {available} to be had"
                + (f"; held by {', '.join(others[:5])}" if others else "")
                + ")"
            )
            for action in node_takers:
                why.setdefault(row_id(action), message)
    # Per job, its live and done actions so far, in plan order.
    sources: dict[int | None, list[Action]] = {}
    for action in sorted([*live, *done], key=row_id):
        if ActionKind(action.kind) is ActionKind.unreserve:
            continue  # giving GPUs back always applies
        earlier = sources.setdefault(action.job_id, [])
        if ActionState(action.state) in UNSTARTED:
            row = jobs.get(action.job_id) if action.job_id is not None else None
            name = (job_names or {}).get(action.job_id) if action.job_id is not None else None
            problem = _job_check(action, row, name, list(earlier))
            if problem is not None:
                why.setdefault(row_id(action), problem)
        if ActionKind(action.kind) is not ActionKind.reserve:
            earlier.append(action)
    for component in action_service.dependency_groups(actions):
        failing = [a for a in component if row_id(a) in why]
        if not failing:
            continue
        first = failing[0]
        falls_with = (
            f"action {row_id(first)} ({first.kind}) of the same plan no longer applies: "
            f"{why[row_id(first)]}"
        )
        for action in component:
            if ActionState(action.state) in UNSTARTED:
                review.expired[row_id(action)] = why.get(row_id(action), falls_with)
        for action in failing:
            review.failing[row_id(action)] = why[row_id(action)]
    review.failing = dict(sorted(review.failing.items()))
    return review
