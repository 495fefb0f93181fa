"""Several clusters planned alone or as one federation group (issue 16, in the simulator).

Hand-worked runs on two one-node clusters: planned alone, a job waits in its full cluster
beside an idle one; planned together, it starts in the other cluster after its image
crossed the sites' link, and that transfer is charged and balanced in the GPU-time books.
The solver's side: the objective's "started away" term, home-first placement by both
engines, the exact model agreeing with the objective.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.engine import JobStatus
from sim.metrics import summarize
from sim.run import run_policy, simulate
from sim.scenario import ScenarioError, build_workload, federation_scenarios, load_scenario
from sim.workload import BlockJob, GpuModel, Node, Transfer, Workload
from solver import Instance
from solver.exact import solve_exact
from solver.federation import split_by_cluster
from solver.instance import GpuModel as SolverGpuModel
from solver.instance import Job, MigrationCostModel
from solver.instance import Node as SolverNode
from solver.objective import evaluate
from solver.plan import ActionKind
from solver.policies import get_policy

HOUR = 3600.0
TRANSFER = Transfer(
    bandwidth_mib_per_s=1000, overhead_s=30, inter_cluster_bandwidth_mib_per_s=100,
    inter_cluster_overhead_s=120,
)  # fmt: skip


def _two_clusters(jobs: list[BlockJob]) -> Workload:
    return Workload(
        name="two-clusters",
        gpu_models={"H100": GpuModel(name="H100")},
        nodes=[
            Node(name="east-0", gpu_model="H100", gpus=8, cluster="east"),
            Node(name="west-0", gpu_model="H100", gpus=8, cluster="west"),
        ],
        jobs=jobs,
        horizon=12 * HOUR,
        transfer=TRANSFER,
    )


def _job(job_id: str, hours: float, *, cluster: str | None = "east", image_gb: float = 10.0):
    return BlockJob(
        id=job_id, submit_time=0.0, gpus=8, work=hours * HOUR, cluster=cluster, image_gb=image_gb
    )


@pytest.mark.parametrize("policy", ["fifo", "shaper"])
def test_planned_alone_a_job_waits_in_its_full_cluster_beside_an_idle_one(policy: str) -> None:
    sim = simulate(
        _two_clusters([_job("long", 10), _job("short", 1)]), policy, check_invariants=True
    )
    short, long_ = sim.jobs["short"], sim.jobs["long"]
    first, second = sorted([short, long_], key=lambda s: s.first_start or 0.0)
    assert first.first_start == 0.0
    assert second.first_start == pytest.approx(first.end_time)  # waited for the first
    assert {s.location for s in sim.jobs.values()} == {"east"}
    assert summarize(sim).metrics["remote_starts"] == 0


@pytest.mark.parametrize("policy", ["federated-fifo", "federated-priority", "federated-shaper"])
def test_planned_together_a_job_starts_in_the_idle_cluster_after_its_image_crossed(
    policy: str,
) -> None:
    sim = simulate(
        _two_clusters([_job("long", 10), _job("short", 1)]), policy, check_invariants=True
    )
    away = [s for s in sim.jobs.values() if s.location == "west"]
    home = [s for s in sim.jobs.values() if s.location == "east"]
    assert len(away) == 1 and len(home) == 1
    transfer = TRANSFER.remote_seconds(10.0)  # 120 s + 10 GiB at 100 MiB/s = 222.4 s
    assert transfer == pytest.approx(222.4)
    assert home[0].end_time == pytest.approx(home[0].spec.work)
    # Both started at once; the one away computed only after its image arrived.
    assert away[0].first_start == 0.0
    assert away[0].end_time == pytest.approx(away[0].spec.work + transfer)
    metrics = summarize(sim).metrics
    assert metrics["remote_starts"] == 1
    assert metrics["migration_gpu_hours"] == pytest.approx(8 * transfer / HOUR)
    assert abs(metrics["unaccounted_gpu_hours"]) < 0.01


def test_federated_shaper_keeps_a_job_at_home_when_home_has_room() -> None:
    small = replace(_job("small", 2), gpus=4)
    sim = simulate(_two_clusters([small]), "federated-shaper", check_invariants=True)
    assert sim.jobs["small"].location == "east"
    assert sim.jobs["small"].end_time == pytest.approx(2 * HOUR)


def test_each_cluster_planned_alone_needs_every_job_to_name_its_cluster() -> None:
    with pytest.raises(ValueError, match="homeless.*federated-shaper|name no cluster"):
        simulate(_two_clusters([_job("homeless", 1, cluster=None)]), "shaper")
    # Planned together it may run anywhere: no home, no transfer.
    sim = simulate(_two_clusters([_job("homeless", 1, cluster=None)]), "federated-shaper")
    assert sim.jobs["homeless"].status is JobStatus.done
    assert summarize(sim).metrics["remote_starts"] == 0


def test_a_scenario_naming_a_cluster_without_nodes_is_refused() -> None:
    data = {
        "name": "bad",
        "gpu_models": {"H100": {}},
        "cluster": [{"prefix": "east", "count": 1, "gpus": 8, "model": "H100", "cluster": "east"}],
        "jobs": [{"id": "j", "gpus": 1, "hours": 1, "cluster": "wset"}],
    }
    with pytest.raises(ValueError, match="j: cluster 'wset' has no nodes"):
        build_workload(data)


# ------------------------------------------------------------------------------- solver


def _instance(job: Job) -> Instance:
    return Instance(
        now=0.0,
        gpu_models=(SolverGpuModel(name="H100", memory_mib=81920),),
        nodes=(
            SolverNode(name="e0", cluster="east", gpu_model="H100", gpus=8),
            SolverNode(name="w0", cluster="west", gpu_model="H100", gpus=8),
        ),
        jobs=(job,),
        migration=MigrationCostModel(inter_cluster_bandwidth_mib_per_s=100),
    )


def test_the_objective_charges_a_start_away_from_home_its_transfer() -> None:
    job = Job(id="j", replicas=4, home_cluster="east", checkpoint_size_mib=10_240)
    instance = _instance(job)
    seconds = instance.migration.remote_start_seconds(job)
    assert seconds == pytest.approx(120 + 102.4)
    assert evaluate(instance, {"j": {"e0": 4}}).migration == 0.0
    away = evaluate(instance, {"j": {"w0": 4}})
    assert away.migration == pytest.approx(4 * seconds / instance.config.value_horizon_s)


def test_a_migration_to_another_cluster_costs_the_transfer_besides_checkpoint_and_restore() -> None:
    job = Job(id="j", replicas=4, placement={"e0": 4}, checkpointable=True, start_time=-HOUR)
    instance = _instance(job)
    model = instance.migration
    assert model.migration_seconds(job, across=True) == pytest.approx(
        model.migration_seconds(job) + model.remote_start_seconds(job)
    )
    horizon = instance.config.value_horizon_s
    across = evaluate(instance, {"j": {"w0": 4}}).migration
    assert across == pytest.approx(4 * model.migration_seconds(job, across=True) / horizon)


@pytest.mark.parametrize("use_cp_sat", [True, False])
def test_both_engines_start_a_job_at_home_when_both_clusters_have_room(use_cp_sat: bool) -> None:
    # East's node is listed first and wins a tie: a job whose home is west must start
    # there on cost alone.
    base = _instance(Job(id="j", replicas=4, home_cluster="west"))
    config = base.config.model_copy(update={"use_cp_sat": use_cp_sat})
    for home, node in (("west", "w0"), ("east", "e0")):
        instance = base.model_copy(
            update={"jobs": (Job(id="j", replicas=4, home_cluster=home),), "config": config}
        )
        plan = get_policy("shaper").plan(instance)
        (start,) = [a for a in plan.actions if a.kind is ActionKind.start]
        assert dict(start.to_placement) == {node: 4}


def test_the_exact_model_prices_a_start_away_as_the_objective_does() -> None:
    job = Job(id="j", replicas=4, home_cluster="east", checkpoint_size_mib=10_240)
    instance = _instance(job)
    for target in ({"j": {"e0": 4}}, {"j": {"w0": 4}}):
        pinned = solve_exact(instance, pin=target, time_limit_s=5.0)
        assert pinned.objective == pytest.approx(evaluate(instance, target).objective)
        assert pinned.bound is not None
        assert pinned.bound == pytest.approx(pinned.objective, abs=1e-3)
    best = solve_exact(instance, time_limit_s=5.0)
    assert best.plan is not None
    (start,) = best.plan.actions
    assert dict(start.to_placement) == {"e0": 4}


def test_splitting_by_cluster_refuses_a_job_that_may_run_in_several() -> None:
    with pytest.raises(ValueError, match="may run in several clusters"):
        split_by_cluster(_instance(Job(id="j", replicas=1)))
    east = Job(id="j", replicas=1, clusters=frozenset({"east"}))
    parts = split_by_cluster(_instance(east))
    assert [[n.name for n in p.nodes] for p in parts] == [["e0"], ["w0"]]
    assert [[j.id for j in p.jobs] for p in parts] == [["j"], []]


# ---------------------------------------------------------------------------- scenarios


def test_the_built_in_federation_scenarios_have_two_clusters_and_homes() -> None:
    assert federation_scenarios() == [
        "federation-hetero",
        "federation-inference",
        "federation-unequal",
    ]
    for name in federation_scenarios():
        workload = load_scenario(name)
        assert len(workload.clusters) == 2, name
        assert all(job.cluster in workload.clusters for job in workload.jobs), name


def test_federation_on_unequal_load_fills_the_idle_cluster_and_the_books_balance() -> None:
    workload = load_scenario("federation-unequal")
    alone = run_policy(workload, "shaper", check_invariants=True).metrics
    together = run_policy(workload, "federated-shaper", check_invariants=True).metrics
    assert alone["remote_starts"] == 0 and together["remote_starts"] > 0
    assert together["jobs_completed"] == alone["jobs_completed"] == len(workload.jobs)
    assert together["utilization"] > alone["utilization"]
    assert together["jct_mean_h"] < alone["jct_mean_h"]
    assert abs(together["unaccounted_gpu_hours"]) < 0.01


def test_the_federation_command_prints_every_policy_and_the_margins(tmp_path) -> None:
    scenario = tmp_path / "two.yaml"
    scenario.write_text(
        """
name: two
horizon_h: 12
gpu_models: {H100: {}}
cluster:
  - {prefix: east, count: 1, gpus: 8, model: H100, cluster: east}
  - {prefix: west, count: 1, gpus: 8, model: H100, cluster: west}
jobs:
  - {id: long, gpus: 8, hours: 10, cluster: east}
  - {id: short, gpus: 8, hours: 1, cluster: east}
"""
    )
    runner = CliRunner()
    args = ["federation", "--scenarios", str(scenario), "--no-progress"]
    result = runner.invoke(sim_app, [*args, "--out-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| two |")]
    assert [row.split("|")[2].strip() for row in rows] == [
        "fifo",
        "priority",
        "shaper",
        "federated-priority",
        "federated-shaper",
    ]
    assert "- two: federated-shaper vs per-cluster shaper: +" in result.output
    one = tmp_path / "one.yaml"
    one.write_text(
        "name: one\ngpu_models: {H100: {}}\n"
        "cluster: [{prefix: a, count: 1, gpus: 8, model: H100}]\n"
        "jobs: [{id: j, gpus: 1, hours: 1}]\n"
    )
    refused = runner.invoke(sim_app, ["federation", "--scenarios", str(one)])
    assert refused.exit_code == 2
    assert "one cluster" in refused.output
    with pytest.raises(ScenarioError):
        load_scenario("federation-nowhere")


@pytest.mark.parametrize("use_cp_sat", [True, False])
def test_a_much_faster_model_away_is_worth_the_transfer(use_cp_sat: bool) -> None:
    # Home has slow GPUs (0.6); the other cluster's are 1.0. Per GPU the faster model is
    # worth 0.4 units an hour; the transfer costs (120 + 102.4) s / 3600 s = 0.06.
    instance = Instance(
        now=0.0,
        gpu_models=(
            SolverGpuModel(name="H100", memory_mib=81920),
            SolverGpuModel(name="A100", memory_mib=81920, speed=0.6),
        ),
        nodes=(
            SolverNode(name="a0", cluster="ampere", gpu_model="A100", gpus=8),
            SolverNode(name="h0", cluster="hopper", gpu_model="H100", gpus=8),
        ),
        jobs=(Job(id="j", replicas=2, home_cluster="ampere", checkpoint_size_mib=10_240),),
        migration=MigrationCostModel(inter_cluster_bandwidth_mib_per_s=100),
    )
    instance = instance.model_copy(
        update={"config": instance.config.model_copy(update={"use_cp_sat": use_cp_sat})}
    )
    plan = get_policy("shaper").plan(instance)
    (start,) = [a for a in plan.actions if a.kind is ActionKind.start]
    assert dict(start.to_placement) == {"h0": 2}


@pytest.mark.parametrize("use_cp_sat", [True, False])
def test_a_start_away_that_costs_more_than_it_gains_is_not_made(use_cp_sat: bool) -> None:
    # East is full; west is empty. Sending a 600,000 MiB image over 100 MiB/s takes
    # 6,120 s: 1.7 units per GPU against the 1.0 an hour of its work is worth.
    running = Job(id="r", replicas=8, placement={"e0": 8}, start_time=-HOUR)
    huge = Job(id="p", replicas=8, home_cluster="east", checkpoint_size_mib=600_000)
    base = _instance(huge)
    config = base.config.model_copy(update={"use_cp_sat": use_cp_sat})
    instance = base.model_copy(update={"jobs": (running, huge), "config": config})
    plan = get_policy("shaper").plan(instance)
    assert [a for a in plan.actions if a.kind is ActionKind.start] == []
    assert evaluate(instance, plan.placement).objective == pytest.approx(
        evaluate(instance, {"r": {"e0": 8}}).objective
    )


def test_cp_sat_itself_keeps_a_job_at_home_when_both_clusters_have_room() -> None:
    # A job that fits nowhere (16 GPUs on one 8-GPU node) keeps the greedy plan from
    # "placing every placeable job", so CP-SAT runs instead of being skipped.
    home_west = Job(id="j", replicas=4, home_cluster="west")
    nowhere = Job(id="x", replicas=16, max_nodes=1)
    base = _instance(home_west)
    instance = base.model_copy(update={"jobs": (home_west, nowhere)})
    plan = get_policy("shaper").plan(instance)
    assert "CP-SAT skipped" not in plan.stats.note
    (start,) = [a for a in plan.actions if a.kind is ActionKind.start]
    assert dict(start.to_placement) == {"w0": 4}


def test_no_plan_may_move_a_running_job_to_another_cluster() -> None:
    from solver.validate import validate
    from tests.solver.builders import plan_from

    moved = Job(id="r", replicas=4, placement={"e0": 4}, checkpointable=True, start_time=-HOUR)
    instance = _instance(moved)
    violations = [str(v) for v in validate(instance, plan_from(instance, {"r": {"w0": 4}}))]
    assert any("moved to another cluster" in v for v in violations)
    # The exact model cannot plan it either: pinned there, it finds no legal plan.
    assert solve_exact(instance, pin={"r": {"w0": 4}}, time_limit_s=5.0).plan is None
