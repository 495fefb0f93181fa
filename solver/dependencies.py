"""Which actions of a plan must wait for which: GPUs a start or a move takes that another
action of the same plan frees.

Per node, an action *takes* the GPUs it adds there (start, the target of a migration, a
service growing) and *frees* those it leaves (preempt, requeue, the source of a
migration, a service shrinking). GPUs free before the plan go first to the takers that
need the fewest (they can start at once); the rest of a node's takers draw, in plan order,
on its freers, and depend on each freer they draw from. The counts are what schedulers
honour, so the rule works on counts, not on GPU indices (schedulers pick their own).

A job's later action in a plan waits for its earlier one and for every action that the
earlier one frees GPUs for: a service whose replicas move (``split_replica_moves``) comes
back only once the work it made room for holds its GPUs, so that the scheduler, which puts
the returning replicas where it likes, cannot put them back where they left.

A plan whose actions need each other's GPUs in a cycle (two jobs swapping nodes) cannot
run as one saga per action; such actions are reported as ``cyclic`` and the control plane
leaves them out, with every action connected to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.instance import Instance, Job
from solver.plan import Action, ActionKind, Plan


@dataclass(frozen=True)
class ActionGraph:
    # Per action (by index in plan.actions): the actions it must wait for.
    depends_on: tuple[tuple[int, ...], ...]
    # Per action: the actions that take GPUs it frees (whom it serves).
    serves: tuple[tuple[int, ...], ...]
    # Actions in a dependency cycle.
    cyclic: frozenset[int]

    def components(self) -> list[frozenset[int]]:
        """Groups of actions connected by dependencies: each stands or falls as a whole."""
        parent = list(range(len(self.depends_on)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for action, prerequisites in enumerate(self.depends_on):
            for prerequisite in prerequisites:
                parent[root(action)] = root(prerequisite)
        groups: dict[int, set[int]] = {}
        for action in range(len(parent)):
            groups.setdefault(root(action), set()).add(action)
        return [frozenset(group) for _, group in sorted(groups.items())]


def gpu_changes(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """GPUs gained (> 0) or left (< 0) per node."""
    return {
        node: after.get(node, 0) - before.get(node, 0)
        for node in sorted(set(before) | set(after))
        if after.get(node, 0) != before.get(node, 0)
    }


def action_graph(instance: Instance, plan: Plan) -> ActionGraph:
    held = dict.fromkeys(instance.node_by_name, 0)
    for job in instance.jobs:
        for node, gpus in job.placement.items():
            held[node] = held.get(node, 0) + gpus
    takers: dict[str, list[tuple[int, int]]] = {}
    freers: dict[str, list[tuple[int, int]]] = {}
    for index, action in enumerate(plan.actions):
        for node, change in gpu_changes(action.from_placement, action.to_placement).items():
            if change > 0:
                takers.setdefault(node, []).append((index, change))
            else:
                freers.setdefault(node, []).append((index, -change))
    depends: list[set[int]] = [set() for _ in plan.actions]
    serves: list[set[int]] = [set() for _ in plan.actions]
    for node, node_takers in takers.items():
        gpus = instance.node_by_name[node].gpus if node in instance.node_by_name else 0
        free = max(0, gpus - held.get(node, 0))
        supply = [[index, gpus_freed] for index, gpus_freed in freers.get(node, [])]
        for index, need in sorted(node_takers, key=lambda t: (t[1], t[0])):
            from_free = min(free, need)
            free -= from_free
            need -= from_free
            for entry in supply:
                if need <= 0:
                    break
                if entry[1] <= 0 or entry[0] == index:
                    continue
                drawn = min(entry[1], need)
                entry[1] -= drawn
                need -= drawn
                depends[index].add(entry[0])
                serves[entry[0]].add(index)
    earlier: dict[str, int] = {}
    for index, action in enumerate(plan.actions):
        first = earlier.setdefault(action.job_id, index)
        if first != index:
            depends[index] |= {first, *serves[first]} - {index}
    return ActionGraph(
        depends_on=tuple(tuple(sorted(d)) for d in depends),
        serves=tuple(tuple(sorted(s)) for s in serves),
        cyclic=_cyclic(depends),
    )


def split_replica_moves(instance: Instance, plan: Plan) -> Plan:
    """``plan`` with each service resize that moves replicas (off some nodes, onto others)
    as two resizes: first the service shrinks off the nodes it leaves (to what it keeps
    where it stays), then it grows back to its planned size. A scheduler that places
    replicas itself is told only which replicas leave (connectors.base.SupportsReplicaMoves)
    and puts the returning ones where it likes; the second resize waits for the work the
    first made room for (``action_graph``), so they cannot land back where they left. Only
    services that are ``migratable`` are split (the others' replicas never move), and only
    where the service keeps ``max(1, min_replicas)`` replicas meanwhile; a move that would
    keep fewer is left whole, for ``unsplit_replica_moves`` to find (the greedy plans none
    with ``SolverConfig.replica_moves_shrink_first``, as the control plane's solves do). The
    plan is returned as it is when nothing is split."""
    actions: list[Action] = []
    for action in plan.actions:
        job = _moving_service(instance, action)
        kept = _kept(action)
        floor = max(1, job.min_replicas) if job is not None else 1
        if job is None or sum(kept.values()) // job.gpus_per_replica < floor:
            actions.append(action)
            continue
        shrunk = sum(kept.values()) // job.gpus_per_replica
        actions.append(action.model_copy(update={"to_placement": kept, "replicas": shrunk}))
        actions.append(action.model_copy(update={"from_placement": dict(kept)}))
    if len(actions) == len(plan.actions):
        return plan
    return plan.model_copy(update={"actions": actions})


def unsplit_replica_moves(instance: Instance, plan: Plan) -> dict[int, str]:
    """The actions (by index) that cannot be carried out as ``split_replica_moves`` would
    (a move of a service's replicas that would keep fewer than ``max(1, min_replicas)``
    where they are: shrinking first would stop it) and every action connected to one by
    dependencies, with why: a plan defers them whole (``Solved.held``)."""
    why: dict[int, str] = {}
    for index, action in enumerate(plan.actions):
        job = _moving_service(instance, action)
        if job is not None:
            why[index] = (
                f"moving {job.id}'s replicas would leave it fewer than "
                f"{max(1, job.min_replicas)} where they are while the work it makes room "
                "for starts: not carried out"
            )
    if not why:
        return {}
    held: dict[int, str] = {}
    for component in action_graph(instance, plan).components():
        reasons = [why[i] for i in sorted(component) if i in why]
        if reasons:
            held.update(dict.fromkeys(component, reasons[0]))
    return held


def _moving_service(instance: Instance, action: Action) -> Job | None:
    """The ``migratable`` service whose replicas ``action`` moves (off some nodes, onto
    others), or None."""
    job = instance.job_by_id.get(action.job_id)
    before, after = action.from_placement, action.to_placement
    moves = (
        action.kind is ActionKind.resize
        and job is not None
        and job.is_elastic
        and job.migratable
        and any(after.get(n, 0) < g for n, g in before.items())
        and any(g > before.get(n, 0) for n, g in after.items())
    )
    return job if moves else None


def _kept(action: Action) -> dict[str, int]:
    """What a resize keeps where it was: per node, the fewer GPUs of before and after."""
    before, after = action.from_placement, action.to_placement
    return {n: min(g, after.get(n, 0)) for n, g in before.items() if after.get(n, 0) > 0}


def _cyclic(depends: list[set[int]]) -> frozenset[int]:
    """Actions on a cycle of the dependency graph (iterative DFS, colour marking)."""
    on_cycle: set[int] = set()
    colour = [0] * len(depends)  # 0 new, 1 on the stack, 2 done
    for start in range(len(depends)):
        if colour[start]:
            continue
        stack: list[tuple[int, list[int]]] = [(start, sorted(depends[start]))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            if not children:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            child = children.pop()
            if colour[child] == 1:
                on_cycle.update(path[path.index(child) :])
            elif colour[child] == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, sorted(depends[child])))
    return frozenset(on_cycle)
