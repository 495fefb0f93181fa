"""The CP-SAT pass and jobs that run one replica per node (``Instance.one_replica_per_node``):
the aggregated model counts such a gang as a chunk of one replica on each of as many nodes
(no option where the group has too few), and its realisation puts each replica on a node
of its own, so CP-SAT's own plan spreads them and passes ``validate``. The model counts
such a gang only where it keeps its distinct nodes beside what else it counts there
(``PlacementModel._add_spread_rows``), so the realisation places what the model counted.

CP-SAT's plan is taken before ``solver.solve`` compares it with the greedy's (which would
hide a CP-SAT plan that lost its gang): phases 1-7 of ``solver.solve._solve``, run here.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model

from bench.instances import EveryRule, random_instance
from solver.actions import build_plan
from solver.cp_sat import CP_SAT_STATUS, placement_solver
from solver.elastic_training import plan_with_elastic_training
from solver.extraction import realise
from solver.greedy import GreedyEngine, sort_key
from solver.greedy.sharing import plan_with_shares
from solver.greedy_variants import GREEDY, best_greedy
from solver.hints import add_best_hint, greedy_hint
from solver.instance import Instance, JobShape
from solver.model import PlacementModel, build_pools
from solver.model_inputs import evacuations, placement_model
from solver.overdue_pass import require_overdue
from solver.plan import Plan, ReasonCode, SolveStats
from solver.validate import validate

from .builders import instance, job, node, running

HOUR = 3600.0
FIXED: dict[str, Any] = {"expected_runtime_s": 5 * HOUR, "checkpointable": False}


def _spread(inst: Instance, *ids: str) -> Instance:
    return inst.model_copy(update={"one_replica_per_node": frozenset(ids)})


def _cp_sat_plan(
    inst: Instance,
    models: list[PlacementModel] | None = None,
    dropped: list[str] | None = None,
    greedy: list[list[int]] | None = None,
) -> Plan:
    """CP-SAT's realised and filled plan of the whole-GPU rigid part, whatever the greedy's
    is worth (``models`` collects the built models, ``dropped`` the block jobs CP-SAT's
    solution counts placed that its realisation does not place, ``greedy`` the greedy's
    starts as values of the model's variables, ``solver.hints.greedy_hint``)."""
    best = best_greedy(inst)
    engine = best.engine
    greedy_decisions = dict(best.result.decisions)
    rebase = engine.rebase()
    keys = sort_key(inst, GREEDY.order)
    queue = sorted(
        (j for j in inst.jobs if not j.is_elastic and not j.is_running), key=lambda j: keys[j.id]
    )
    model = placement_model(engine, queue, rebase.missing, dict(best.result.pending))
    model.build()
    if greedy is not None:
        greedy.append(greedy_hint(model, rebase.starts, rebase.scale_ups))
    require_overdue(model)
    add_best_hint(model, rebase)
    solver = placement_solver(inst.config)
    status = solver.solve(model.model)
    assert status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if models is not None:
        models.append(model)
    counted = _counted_jobs(model, solver)
    realise(model, solver, engine)
    if dropped is not None:
        dropped.extend(j for j in counted if j not in engine.state.placement)
    engine.fill(queue, rebase.missing)
    kept = (ReasonCode.preempted_by_higher_priority, ReasonCode.defragmentation)
    decisions = {j: r for j, r in greedy_decisions.items() if r.code in kept}
    decisions.update(engine.result.decisions)
    return build_plan(
        inst,
        policy="shaper",
        target=engine.result.target(),
        decisions=decisions,
        pending=dict(engine.result.pending),
        stats=SolveStats(status=CP_SAT_STATUS[status], engine="cp-sat"),
    )


def _counted_jobs(model: PlacementModel, solver: cp_model.CpSolver) -> list[str]:
    """The block jobs a solution counts placed, taken from each class in order as
    ``solver.extraction.realise`` takes them."""
    taken: dict[int, int] = {}
    counted: list[str] = []
    for option in model.options:
        job_class = option.job_class
        if job_class.elastic:
            continue
        for _ in range(solver.value(option.var)):
            index = taken.get(job_class.index, 0)
            taken[job_class.index] = index + 1
            if index < len(job_class.jobs):
                counted.append(job_class.jobs[index].id)
    return counted


def _cp_sat_plan_of_everything(inst: Instance, models: list[PlacementModel]) -> Plan:
    """As ``solver.solve`` wraps its search: shares, MIG and elastic training around it."""
    return plan_with_shares(
        inst,
        lambda whole: plan_with_elastic_training(whole, lambda rest: _cp_sat_plan(rest, models)),
    )


def _blocked_instance() -> Instance:
    """a is empty, b and c have 4 GPUs free each; the gang g (2 × 4, worth more) and h (8)
    both fit only if g spreads over b and c. Counted packed (one 8-GPU chunk), g took the
    model's only 8-GPU node and h waited; realised from the emptiest node, g took a and b."""
    jobs = [
        running("rb", {"b": 4}, **FIXED),
        running("rc", {"c": 4}, **FIXED),
        job("g", gpus=4, replicas=2, max_nodes=2, priority=3.0),
        job("h", 8),
    ]
    return _spread(instance([node("a"), node("b"), node("c")], jobs), "g")


def test_cp_sat_counts_a_spread_gang_as_a_replica_per_node_and_spreads_it() -> None:
    inst = _blocked_instance()
    models: list[PlacementModel] = []
    plan = _cp_sat_plan(inst, models)
    (model,) = models
    (gang,) = [o for o in model.options if o.job_class.jobs[0].id == "g"]
    assert (gang.nodes, gang.chunk_replicas, gang.chunk_gpus) == (2, 1, 4)
    assert plan.placement["g"] == {"b": 4, "c": 4}
    assert plan.placement["h"] == {"a": 8}
    assert validate(inst, plan) == []


def test_a_spread_gang_is_realised_before_smaller_single_node_jobs() -> None:
    """b has room for one GPU, which the gang needs for its second replica: a 1-GPU job
    realised first would take it (best fit), and the gang would find no second node."""
    jobs = [
        running("ra", {"a": 3}, **FIXED),
        running("rb", {"b": 7}, **FIXED),
        job("a1", 1),
        job("g", gpus=1, replicas=2),
        job("w", 2),
        job("x", 1),
    ]
    inst = _spread(instance([node("a"), node("b")], jobs), "g")
    plan = _cp_sat_plan(inst)
    assert plan.placement["g"] == {"a": 1, "b": 1}
    assert {"a1", "w", "x"} <= set(plan.placement)
    assert validate(inst, plan) == []


def test_a_spread_gang_takes_the_tightest_nodes_for_its_replicas() -> None:
    """b and c have 4 GPUs free, a all 8: the gang g (2 × 4, realised first, being larger)
    goes on b and c, a replica each at best fit, and leaves a whole for h (6). Taken from
    the emptiest nodes first, it would take a and b, and h would find no node."""
    jobs = [
        running("rb", {"b": 4}, **FIXED),
        running("rc", {"c": 4}, **FIXED),
        job("g", gpus=4, replicas=2),
        job("h", 6),
    ]
    inst = _spread(instance([node("a"), node("b"), node("c")], jobs), "g")
    plan = _cp_sat_plan(inst)
    assert plan.placement["g"] == {"b": 4, "c": 4}
    assert plan.placement["h"] == {"a": 6}
    assert validate(inst, plan) == []


def test_the_model_counts_a_spread_gang_only_beside_what_leaves_it_its_nodes() -> None:
    """a and b are empty; the gang g (2 × 3, worth more) and h (8) fit the free GPUs
    together (14 of 16, two nodes with room for a replica) but not the nodes: h takes a
    node whole and g's replicas need two. Counted per free-GPU level, both were placed;
    realised largest first, h took a, g found one node, and CP-SAT's own plan lost its
    most valuable job. The model now counts what g's nodes lose for items of 8 GPUs
    (all 8 of each, not g's 3), so it counts g alone, and the realisation places it."""
    jobs = [job("g", gpus=3, replicas=2, priority=3.0), job("h", 8)]
    inst = _spread(instance([node("a"), node("b")], jobs), "g")
    dropped: list[str] = []
    plan = _cp_sat_plan(inst, dropped=dropped)
    assert dropped == []
    assert plan.placement["g"] == {"a": 3, "b": 3} and "h" not in plan.placement
    assert validate(inst, plan) == []


def test_two_spread_gangs_do_not_count_one_scarce_node_twice() -> None:
    """a has one GPU free, b and c all 8: g and h (3 × 1 each) both need all three nodes,
    and a holds one replica. Per free-GPU level (17 GPUs for 6 replicas) both fitted and
    the realisation dropped h; the model now bounds what such gangs put on nodes with
    few slots of their size (here a's one), so it counts g alone."""
    jobs = [
        running("ra", {"a": 7}, **FIXED),
        job("g", replicas=3, priority=3.0),
        job("h", replicas=3, priority=2.0),
    ]
    inst = _spread(instance([node("a"), node("b"), node("c")], jobs), "g", "h")
    dropped: list[str] = []
    plan = _cp_sat_plan(inst, dropped=dropped)
    assert dropped == []
    assert plan.placement["g"] == {"a": 1, "b": 1, "c": 1} and "h" not in plan.placement
    assert validate(inst, plan) == []


def test_a_spread_gang_does_not_share_a_class_with_an_ordinary_gang_of_its_shape() -> None:
    jobs = [job("g", gpus=4, replicas=2, max_nodes=2), job("o", gpus=4, replicas=2, max_nodes=2)]
    inst = _spread(instance([node("a"), node("b"), node("c"), node("d")], jobs), "g")
    models: list[PlacementModel] = []
    plan = _cp_sat_plan(inst, models)
    shapes = {
        o.job_class.jobs[0].id: (len(o.job_class.jobs), o.nodes, o.chunk_replicas)
        for o in models[0].options
    }
    assert shapes == {"g": (1, 2, 1), "o": (1, 1, 2)}
    assert len(plan.placement["g"]) == 2 and len(plan.placement["o"]) == 1
    assert validate(inst, plan) == []


def test_a_spread_gang_gets_no_option_where_too_few_nodes_have_room_for_a_replica() -> None:
    # Three replicas of 4, two 8-GPU nodes: packed they would fit, spread they cannot.
    inst = _spread(
        instance(
            [node("a"), node("b")],
            [job("g", gpus=4, replicas=3, max_nodes=3, expected_runtime_s=HOUR), job("p", 2)],
        ),
        "g",
    )
    models: list[PlacementModel] = []
    plan = _cp_sat_plan(inst, models)
    assert [o.job_class.jobs[0].id for o in models[0].options] == ["p"]
    assert "g" not in plan.placement and plan.pending["g"].code is not ReasonCode.placed
    assert validate(inst, plan) == []
    # Three nodes, but one with only 2 GPUs free: still too few with room for a replica;
    # and max_nodes below the replicas rules spreading out wherever it is.
    narrow = _spread(
        instance(
            [node("a"), node("b"), node("c")],
            [running("rc", {"c": 6}, **FIXED), job("g", gpus=4, replicas=3, max_nodes=3)],
        ),
        "g",
    )
    capped = _spread(
        instance([node(n) for n in "abcd"], [job("g", gpus=4, replicas=3, max_nodes=2)]), "g"
    )
    for waiting in (narrow, capped):
        models.clear()
        plan = _cp_sat_plan(waiting, models)
        assert models[0].options == [] and "g" not in plan.placement
        assert validate(waiting, plan) == []


def test_no_evacuation_moves_a_spread_job_held_packed_on_one_node() -> None:
    """Residents move whole onto one node: such a job would stay, so its node is not
    counted as one to empty (and no move puts one of its replicas beside another)."""
    jobs = [
        running("r", {"a": 4}, gpus=2, checkpointable=True),
        running("q", {"b": 4}, checkpointable=True),
        job("g", 8),
    ]
    inst = instance([node("a"), node("b")], jobs)
    for marked, emptied in ((inst, [["a", "b"]]), (_spread(inst, "r"), [["b"]])):
        engine = GreedyEngine(marked, GREEDY)
        kinds = evacuations(engine, build_pools(engine.state), budget=2)
        names = [[marked.nodes[n].name for n in kind.nodes] for kind in kinds]
        assert sorted(map(sorted, names)) == emptied


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    nodes=st.integers(min_value=3, max_value=10),
    pending=st.integers(min_value=1, max_value=14),
    share=st.floats(min_value=0.0, max_value=1.0),
)
# Found with more examples: a team's guarantee (solver/constraints/quota.py) asked the
# model to start GPUs again that no option of it could, and the model was infeasible.
@example(seed=1827944245, nodes=6, pending=7, share=0.8148971620921012)
def test_cp_sat_plans_never_put_two_replicas_of_a_spread_job_on_a_node(
    seed: int, nodes: int, pending: int, share: float
) -> None:
    inst = random_instance(seed, EveryRule(nodes, pending))
    inst = inst.model_copy(
        update={
            "config": inst.config.model_copy(
                update={"deterministic": True, "time_limit_s": 1.0, "num_workers": 1}
            )
        }
    )
    gangs = sorted(j.id for j in inst.jobs if j.shape is JobShape.block and j.replicas > 1)
    chosen = gangs[: round(share * len(gangs))]
    # Jobs that hold two replicas on a node already are left out: Slurm never reports one.
    jobs = inst.job_by_id
    chosen = [
        j for j in chosen if all(g <= jobs[j].gpus_per_replica for g in jobs[j].placement.values())
    ]
    # Their nodes bounded by their replicas only, as Slurm's are (``--nodes``).
    unbounded = [
        j.model_copy(update={"max_nodes": None}) if j.id in chosen else j for j in inst.jobs
    ]
    spread = _spread(inst.model_copy(update={"jobs": tuple(unbounded)}), *chosen)
    models: list[PlacementModel] = []
    plan = _cp_sat_plan_of_everything(spread, models)
    assert validate(spread, plan) == []
    # The model never counts two replicas of such a gang on one node either.
    for option in (o for model in models for o in model.options):
        if option.job_class.jobs[0].id in chosen:
            assert option.chunk_replicas == 1 and option.nodes == option.job_class.replicas
    for job_id in chosen:
        assert all(
            g == jobs[job_id].gpus_per_replica for g in plan.placement.get(job_id, {}).values()
        )


def _rows_broken(model: PlacementModel, values: list[int]) -> list[str]:
    """The rows ``PlacementModel._add_spread_rows`` added that ``values`` break, each
    ``spread_absent`` Boolean set to 1 unless a count of its shape is positive."""
    proto = model.model.proto
    values = list(values)
    absent = {i for i, v in enumerate(proto.variables) if v.name.startswith("spread_absent")}
    forced: set[int] = set()
    for row in proto.constraints:
        if row.name.startswith("spread_absent"):
            counts = [v for v in row.linear.vars if v not in absent]
            if any(values[v] > 0 for v in counts):
                forced.update(v for v in row.linear.vars if v in absent)
    for index in absent:
        values[index] = 0 if index in forced else 1
    broken = []
    for row in proto.constraints:
        if row.name.startswith("spread_"):
            linear = row.linear
            total = sum(values[v] * c for v, c in zip(linear.vars, linear.coeffs, strict=True))
            domain = list(linear.domain)  # (the proto's own [-1] is not the last)
            if not domain[0] <= total <= domain[-1]:
                broken.append(row.name)
    return broken


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    used=st.lists(st.sampled_from([4, 2, 6, 0, 1, 3, 5, 7]), min_size=2, max_size=6),
    gang=st.tuples(
        st.sampled_from([1, 2, 4]), st.integers(min_value=2, max_value=4), st.sampled_from([1, 3])
    ),
    singles=st.lists(
        st.tuples(st.sampled_from([4, 8, 2, 1]), st.sampled_from([1, 2, 3])),
        min_size=2,
        max_size=6,
    ),
)
def test_a_spread_gang_cp_sat_counts_placed_is_placed_by_its_own_plan(
    used: list[int], gang: tuple[int, int, int], singles: list[tuple[int, int]]
) -> None:
    """One spread gang among single-node jobs of whole powers of two, on 8-GPU nodes
    partly held by jobs that stay: what CP-SAT counts of the gang, the realisation places
    (no fallback to the greedy needed for it); and the rows that make it so keep the
    greedy's own placement, a legal one, so they cut off no plan a node could hold."""
    nodes = [node(f"n{i}") for i in range(len(used))]
    jobs = [running(f"r{i}", {f"n{i}": held}, **FIXED) for i, held in enumerate(used) if held]
    gpus, replicas, priority = gang
    jobs.append(job("g", gpus=gpus, replicas=replicas, priority=float(priority)))
    jobs += [job(f"s{i}", size, priority=float(p)) for i, (size, p) in enumerate(singles)]
    inst = _spread(instance(nodes, jobs), "g")
    models: list[PlacementModel] = []
    dropped: list[str] = []
    greedy: list[list[int]] = []
    plan = _cp_sat_plan(inst, models, dropped, greedy)
    assert "g" not in dropped
    assert validate(inst, plan) == []
    assert _rows_broken(models[0], greedy[0]) == []
