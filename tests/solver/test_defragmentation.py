"""Defragmentation's moves (``solver.greedy.defragmentation``): a service's replicas and
part of a node, checked through the whole solve (greedy, then CP-SAT on its base)."""

from __future__ import annotations

from solver.plan import ActionKind
from solver.solve import solve
from solver.validate import validate

from .builders import instance, job, node, running, service


def test_a_moved_service_keeps_its_replicas_through_the_cp_sat_pass() -> None:
    # The gang needs a and b whole; the service's two replicas move to c. The CP-SAT pass
    # works from the greedy's base, which once counted the moved replicas as a scale-up
    # to undo, and gave the service's GPUs to P: the service went from 2 replicas to 0.
    jobs = [
        service("S", (2,), {"a": 1, "b": 1}, preemptible=False),
        running("K", {"c": 6}, preemptible=False),
        job("G", 8, replicas=2, priority=30.0),
        job("P", 2, priority=20.0),
    ]
    inst = instance([node("a"), node("b"), node("c")], jobs)
    plan = solve(inst)
    assert not validate(inst, plan)
    assert plan.placement["G"] == {"a": 8, "b": 8}
    assert plan.placement["S"] == {"c": 2}


def test_making_room_does_not_let_a_job_past_a_forecast_reservation() -> None:
    # h1 is kept for R's coming peak; J (long, not checkpointable) may not take it. Moving
    # T off a1 once found J a place on h1 instead of the node cleared for it.
    jobs = [
        service("R", (0, 8, 8, 8, 8, 8, 8, 8), {}, allowed_gpu_models=frozenset({"h100"})),
        running("T", {"a1": 2}, checkpointable=True, preemptible=False),
        running("T2", {"a1": 2}, preemptible=False),
        running("K", {"a1": 2}, preemptible=False),
        job("J", 4, expected_runtime_s=10 * 86400.0),
    ]
    inst = instance([node("h1", model="h100"), node("a1")], jobs)
    plan = solve(inst)
    assert not validate(inst, plan)
    assert plan.placement["J"] == {"a1": 4}  # on the node cleared for it, not on h1


def test_no_move_that_costs_more_than_the_start_it_makes_room_for() -> None:
    # A priority-10 replica to a slower GPU, or a priority-10 job with a 2 TB checkpoint
    # migrated, so that a priority-0.1 job can start: both lose value, and are not made.
    service_case = [
        service("S", (1,), {"h1": 1}, priority=10.0),
        running("K", {"h1": 5}, preemptible=False),
        running("K2", {"a1": 7}, preemptible=False),
        job("J", 3, priority=0.1),
    ]
    inst = instance([node("h1", model="h100"), node("a1")], service_case)
    assert not solve(inst).actions
    migration_case = [
        running(
            "B",
            {"a": 2},
            checkpointable=True,
            preemptible=False,
            priority=10.0,
            checkpoint_size_mib=2_000_000,
        ),
        running("K", {"a": 4}, preemptible=False),
        running("K2", {"b": 6}, preemptible=False),
        job("J", 3, priority=0.1),
    ]
    assert not solve(instance([node("a"), node("b")], migration_case)).actions
    # Worth it for a job of the same priority with a small checkpoint.
    cheap = [
        running("B", {"a": 2}, checkpointable=True, preemptible=False, checkpoint_size_mib=100),
        *migration_case[1:3],
        job("J", 3),
    ]
    kinds = {a.kind for a in solve(instance([node("a"), node("b")], cheap)).actions}
    assert kinds == {ActionKind.migrate, ActionKind.start}


def test_a_gang_uses_a_free_node_beside_the_one_a_small_job_is_moved_off() -> None:
    # G needs two whole nodes: b is free, a holds the small checkpointable T, c is kept by
    # K. T moves to d's free half, and G starts on a and b. Free nodes once did not count
    # toward the room emptied nodes make, so only a gang whose every node held movable
    # work was ever helped.
    jobs = [
        running("T", {"a": 2}, checkpointable=True, preemptible=False),
        running("K", {"c": 8}, preemptible=False),
        running("K2", {"d": 4}, preemptible=False),
        job("G", 8, replicas=2, priority=30.0),
    ]
    inst = instance([node("a"), node("b"), node("c"), node("d")], jobs)
    plan = solve(inst)
    assert not validate(inst, plan)
    assert plan.placement["G"] == {"a": 8, "b": 8}
    assert plan.placement["T"] == {"d": 2}
    (move,) = [a for a in plan.actions if a.job_id == "T"]
    assert move.kind is ActionKind.migrate


def test_free_nodes_do_not_take_the_slots_of_a_gang_of_few_nodes() -> None:
    # G: 16 GPUs on at most 2 nodes. e and f have 4 free each beside residents that stay;
    # c and d, emptied of T1-T4 (to the h100s), hold all of G. Free nodes counted first once
    # took both of G's node slots and left it waiting (review finding).
    jobs = [
        running("K1", {"a": 7}, preemptible=False),
        running("K2", {"b": 7}, preemptible=False),
        running("K3", {"e": 4}, preemptible=False),
        running("K4", {"f": 4}, preemptible=False),
        *(
            running(name, {where: 4}, checkpointable=True, preemptible=False)
            for name, where in (("T1", "c"), ("T2", "c"), ("T3", "d"), ("T4", "d"))
        ),
        job(
            "G", 1, replicas=16, max_nodes=2, priority=30.0, allowed_gpu_models=frozenset({"a100"})
        ),
    ]
    nodes = [node(n) for n in "abcdef"] + [node("h1", model="h100"), node("h2", model="h100")]
    inst = instance(nodes, jobs)
    plan = solve(inst)
    assert not validate(inst, plan)
    assert plan.placement["G"] == {"c": 8, "d": 8}
