"""The FGD workload-inflation experiment on excerpts of the Alibaba 2023 trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.fgd import (
    ALL_POLICIES,
    FULL,
    Cluster,
    InflationResult,
    Pod,
    TaskMix,
    compare_to_baselines,
    read_pods,
    run_inflation,
    select_node,
    spread_over_seeds,
)
from sim.fgd.preemption import preempt_for
from sim.fgd.workload import inflated_workload
from sim.traces import TraceError, TraceInput
from solver.fragmentation import as_typical, node_fragmentation

DATA = Path(__file__).parent / "data"
NODES = DATA / "alibaba-nodes-sample.csv"
PODS = DATA / "alibaba-pods-sample.csv"
RESOURCE_PODS = DATA / "alibaba-pods-resources-only.csv"


def flat(output: str) -> str:
    """CLI output on one line, without the error panel's borders (which wrap messages)."""
    return " ".join(output.replace("│", " ").split())


def check_cluster(cluster: Cluster) -> None:
    """Nothing over-committed, and the free capacity is exactly capacity − placed pods."""
    assert (cluster.cpu >= 0).all() and (cluster.mem >= 0).all()
    real = cluster.gpu[cluster.gpu >= 0]
    assert (real <= FULL).all()
    cpu = cluster.cpu_cap.copy()
    mem = cluster.mem_cap.copy()
    gpu = np.where(cluster.gpu >= 0, FULL, -1)
    for node, hosted in enumerate(cluster.hosted):
        for pod, gpus in hosted:
            cpu[node] -= pod.cpu
            mem[node] -= pod.mem
            assert len(gpus) == pod.gpus
            for g in gpus:
                gpu[node, g] -= pod.milli if pod.shares else FULL
            if pod.models:
                assert cluster.models[node] in pod.models
    assert (cpu == cluster.cpu).all() and (mem == cluster.mem).all()
    assert (gpu == cluster.gpu).all()
    # What shaper-preempt may take back is what the best-effort pods hold.
    be_cpu = np.zeros_like(cluster.be_cpu)
    be_mem = np.zeros_like(cluster.be_mem)
    guarded = np.zeros_like(cluster.guarded)
    for node, hosted in enumerate(cluster.hosted):
        for pod, gpus in hosted:
            if pod.best_effort:
                be_cpu[node] += pod.cpu
                be_mem[node] += pod.mem
            for g in gpus if not pod.best_effort else ():
                guarded[node, g] += pod.milli if pod.shares else FULL
    assert (be_cpu == cluster.be_cpu).all() and (be_mem == cluster.be_mem).all()
    assert (guarded == cluster.guarded).all()


@pytest.mark.parametrize(
    ("policy", "movable"),
    [(p, "be") for p in (*ALL_POLICIES, "fgd-memory")]
    + [("shaper-defrag", "all"), ("shaper-preempt", "all")],
)
def test_inflation_conserves_capacity(policy: str, movable: str) -> None:
    result = run_inflation(NODES, PODS, policy, seed=3, movable=movable)
    assert result.cluster is not None
    check_cluster(result.cluster)
    capacity = int(result.cluster.gpu_count.sum())
    assert result.capacity_gpus == capacity
    # Requests stop just short of 1.3 × capacity (the next pod would have gone past it).
    assert 1.3 * capacity - 8 <= result.arrived_gpus <= 1.3 * capacity + 8
    assert result.allocated_gpus + result.unallocated_gpus == pytest.approx(capacity)
    # More was asked than fits: some pods must have failed.
    assert result.pods_failed > 0
    assert 0 <= result.fragmented_share <= 1


def test_same_seed_same_result() -> None:
    a = run_inflation(NODES, PODS, "random", seed=9).to_json()
    b = run_inflation(NODES, PODS, "random", seed=9).to_json()
    c = run_inflation(NODES, PODS, "random", seed=10).to_json()
    assert a == b and a != c


def tiny_cluster(tmp_path: Path) -> Cluster:
    """Two T4 nodes with 2 GPUs each: A with 32 cores, B with 8."""
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nA,32000,65536,2,T4\nB,8000,65536,2,T4\n")
    return Cluster(path)


def tiny_mix() -> TaskMix:
    """Three pod types: CPU-only (4 cores, 20 %), half a GPU (2 cores, 50 %), one whole GPU
    (6 cores, 30 %)."""
    mix = TaskMix([])
    mix.set_kinds([(4000, 0, 0, (), 0.2), (2000, 500, 1, (), 0.5), (6000, FULL, 1, (), 0.3)])
    return mix


def test_fragmentation_rules_by_hand(tmp_path: Path) -> None:
    cluster = tiny_cluster(tmp_path)
    mix = tiny_mix()
    gpu = np.array([[FULL, 300] + [-1] * 6, [FULL, 300] + [-1] * 6])
    cpu = np.array([32000, 4000])
    frag = mix.node_fragmentation(gpu, cpu, cluster.model_names)
    # A: CPU-only type: all 1,300 free milli (0.2 × 1300 = 260); half-GPU type fits, the
    # 300 on GPU 1 are too small (0.5 × 300 = 150); whole-GPU type fits, same 300 (0.3 × 300
    # = 90).
    assert frag[0] == pytest.approx(260 + 150 + 90)
    # B: only 4 cores left: the whole-GPU type (6 cores) cannot run, all 1,300 milli are
    # fragmented for it (0.3 × 1300 = 390); memory does not count.
    assert frag[1] == pytest.approx(260 + 150 + 390)
    # A model the type does not accept: everything is fragmented for it.
    mix.set_kinds([(2000, 500, 1, ("V100M16",), 1.0)])
    assert mix.node_fragmentation(gpu, cpu, cluster.model_names)[0] == pytest.approx(1300)


def test_fragmentation_counts_memory_when_given(tmp_path: Path) -> None:
    cluster = tiny_cluster(tmp_path)
    mix = tiny_mix()
    # The least memory of each kind's pods: the half-GPU kind 2,048 MiB, the whole-GPU 8,192.
    mix.least_memory = {(2000, 500, 1, ()): 2048, (6000, FULL, 1, ()): 8192}
    mix.set_kinds(mix.kinds)
    gpu = np.array([[FULL, 300] + [-1] * 6] * 3)
    cpu = np.array([32000, 32000, 32000])
    mem = np.array([65536, 4096, 1024])
    blind = mix.node_fragmentation(gpu, cpu, cluster.model_names)
    aware = mix.node_fragmentation(gpu, cpu, cluster.model_names, mem)
    # With memory to spare nothing changes (as in the CPU-rules test: 260 + 150 + 90).
    assert blind == pytest.approx([500, 500, 500])
    assert aware[0] == pytest.approx(500)
    # 4,096 MiB: the whole-GPU kind no longer fits: all 1,300 milli (0.3 × 1300 = 390).
    assert aware[1] == pytest.approx(260 + 150 + 390)
    # 1,024 MiB: neither GPU kind fits (0.5 × 1300 = 650 and 390).
    assert aware[2] == pytest.approx(260 + 650 + 390)
    # The solver's measure (solver.fragmentation) agrees, node by node.
    shapes = as_typical((((c, m, g, mo), sh) for c, m, g, mo, sh in mix.kinds), mix.least_memory)
    for node in range(3):
        free = [int(f) for f in gpu[node] if f >= 0]
        assert node_fragmentation(free, int(cpu[node]), "", shapes, int(mem[node])) == (
            pytest.approx(aware[node])
        )


def test_fgd_memory_keeps_a_node_with_memory_for_the_expected_work(tmp_path: Path) -> None:
    cluster = tiny_cluster(tmp_path)
    mix = tiny_mix()
    mix.least_memory = {(2000, 500, 1, ()): 2048, (6000, FULL, 1, ()): 8192}
    mix.set_kinds(mix.kinds)
    pod = Pod(cpu=2000, mem=6144, gpus=1, milli=FULL, models=(), checkpointable=False)
    # Both nodes alike but in memory: A would keep 2,048 MiB after the pod, B 10,240.
    cluster.gpu[:, :2] = FULL
    cluster.cpu[:] = 32000
    cluster.mem[:] = [8192, 16384]
    cluster.tie_rank = np.array([0, 1])  # ties go to A
    rng = np.random.default_rng(0)
    assert select_node("fgd", cluster, pod, rng, mix)[0] == 0  # memory-blind: a tie, A first
    assert select_node("fgd-memory", cluster, pod, rng, mix)[0] == 1


def test_fgd_choice_by_hand(tmp_path: Path) -> None:
    cluster = tiny_cluster(tmp_path)
    cluster.gpu[0, :2] = [FULL, 600]  # A: GPU 1 already 40 % used
    pod = Pod(cpu=2000, mem=1024, gpus=1, milli=500, models=(), checkpointable=False)
    # A before: 0.2 × 1600 + 0 + 0.3 × 600 = 500.
    # A, GPU 1 (600 -> 100): 0.2 × 1100 + 0.5 × 100 + 0.3 × 100 = 300: -200 -> score 54.
    # A, GPU 0 (no whole GPU left): 0.2 × 1100 + 0 + 0.3 × 1100 = 550: +50 -> score 48.
    # B (8 cores) GPU 0: 400 -> 0.2 × 1500 + 0 + 0.3 × 500 = 450: +50 -> score 48.
    choice = select_node("fgd", cluster, pod, np.random.default_rng(0), tiny_mix())
    assert choice == (0, (1,))
    # With only 7 cores on B and A full, B's GPU 0 leaves 5 cores: the whole-GPU type no
    # longer fits B at all, yet the pod must go somewhere: B it is.
    cluster.gpu[0, :2] = [0, 0]
    cluster.cpu[1] = 7000
    assert select_node("fgd", cluster, pod, np.random.default_rng(0), tiny_mix()) == (1, (0,))


def test_typical_pods_by_count_with_cpu_pods() -> None:
    def pod(cpu: int, gpus: int, milli: int) -> Pod:
        return Pod(cpu=cpu, mem=1, gpus=gpus, milli=milli, models=(), checkpointable=False)

    pods = [pod(3000, 1, 500)] * 12 + [pod(8000, 0, 0)] * 7 + [pod(1000, 8, FULL)]
    mix = TaskMix(pods)
    # 12 + 7 of 20 pods reach 95 %: the 8-GPU pod is left out, the rest renormalized.
    assert [k[:3] for k in mix.kinds] == [(3000, 500, 1), (8000, 0, 0)]
    assert [k[4] for k in mix.kinds] == pytest.approx([12 / 19, 7 / 19])


def test_workload_every_pod_then_draws() -> None:
    pods = [Pod(1000, 1, 1, 500, (), False), Pod(1000, 1, 2, FULL, (), False)] * 5
    order = inflated_workload(pods, capacity=20_000, target=1.3, rng=np.random.default_rng(1))
    assert sorted(map(id, order[:10])) == sorted(map(id, pods))  # each pod once, first
    total = sum(p.gpu_request for p in order)
    assert 26_000 - 2 * FULL < total <= 26_000


def test_compare_over_the_curve() -> None:
    def result(policy: str, curve: list[tuple[float, float]]) -> InflationResult:
        return InflationResult(
            policy, 10, 13, 10 - curve[-1][1], curve[-1][1], 0, 0, 1, 0, 0, curve
        )

    base = result("dot-product", [(0.9, 2.0), (1.0, 4.0), (1.3, 4.0)])
    other = result("best-fit", [(0.9, 1.0), (1.0, 5.0), (1.3, 5.0)])
    fgd = result("fgd", [(0.9, 1.0), (1.0, 2.0), (1.3, 3.0)])
    assert compare_to_baselines([base, other, fgd]) is base
    assert fgd.best_reduction == pytest.approx(0.5) and fgd.best_reduction_at == 1.0
    assert fgd.unallocated_at(1.3) == 3.0


def test_cli_inflation(tmp_path: Path) -> None:
    out = tmp_path / "inflation.json"
    result = CliRunner().invoke(
        sim_app,
        [
            "inflation",
            str(PODS),
            "--nodes",
            str(NODES),
            "--policies",
            "best-fit,shaper-defrag",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["best-fit", "shaper-defrag"]


def test_preemption_by_hand(tmp_path: Path) -> None:
    cluster = tiny_cluster(tmp_path)
    mix = tiny_mix()
    rng = np.random.default_rng(0)
    be = Pod(cpu=2000, mem=1, gpus=1, milli=300, models=(), checkpointable=True, best_effort=True)
    ls_half = Pod(cpu=2000, mem=1, gpus=1, milli=500, models=(), checkpointable=False)
    whole = Pod(cpu=2000, mem=1, gpus=1, milli=FULL, models=(), checkpointable=False)
    big_be = Pod(
        cpu=20000, mem=1, gpus=0, milli=0, models=(), checkpointable=True, best_effort=True
    )
    # A: GPU 0 shared by a best-effort pod (300), GPU 1 by a latency-sensitive one (500),
    # and a CPU-only best-effort pod taking 20 of its 32 cores. B: both GPUs whole-used.
    cluster.place(0, be, (0,))
    cluster.place(0, ls_half, (1,))
    cluster.place(0, big_be, ())
    cluster.place(1, whole, (0,))
    cluster.place(1, whole, (1,))
    before = cluster.allocated_milli()
    # A whole GPU is wanted: GPU 0 of A once the 300-milli best-effort pod leaves (it fits
    # nowhere else: preempted). GPU 1 keeps its latency-sensitive pod.
    assert preempt_for(cluster, whole, rng, mix, "best-fit") == (0, 1)
    assert cluster.allocated_milli() == before - 300 + FULL
    assert [p for p, _ in cluster.hosted[0]] == [ls_half, big_be, whole]
    check_cluster(cluster)
    # No GPU free of latency-sensitive work is left: two whole GPUs cannot be had.
    two = Pod(cpu=2000, mem=1, gpus=2, milli=FULL, models=(), checkpointable=False)
    assert preempt_for(cluster, two, rng, mix, "best-fit") is None
    check_cluster(cluster)


def test_ties_go_to_the_first_node_in_the_fixed_order(tmp_path: Path) -> None:
    # The reference's scheduler takes the smallest node name among equal scores, and its
    # node names start with a random permutation index: a fixed order, not a coin flip.
    pod = Pod(cpu=1000, mem=1, gpus=1, milli=FULL, models=(), checkpointable=False)
    for rank, expected in (([1, 0], 1), ([0, 1], 0)):
        cluster = tiny_cluster(tmp_path)
        cluster.cpu[:] = 8000  # the two nodes are now alike
        cluster.tie_rank = np.array(rank)
        for policy in ("best-fit", "fgd", "dot-product"):
            chosen = select_node(policy, cluster, pod, np.random.default_rng(0), tiny_mix())
            assert chosen is not None and chosen[0] == expected, policy


def test_spread_over_seeds_by_hand() -> None:
    def result(policy: str, unallocated: float) -> InflationResult:
        return InflationResult(policy, 10, 13, 10 - unallocated, unallocated, 0, 0, 1, 0, 0)

    seed_a = [result("best-fit", 4.0), result("fgd", 2.0), result("dot-product", 5.0)]
    seed_b = [result("best-fit", 6.0), result("fgd", 3.0), result("dot-product", 5.0)]
    seed_c = [result("best-fit", 2.0), result("fgd", 1.5), result("dot-product", 8.0)]
    spreads = {s.policy: s for s in spread_over_seeds([seed_a, seed_b, seed_c])}
    fgd = spreads["fgd"]
    assert (fgd.seeds, fgd.median_unallocated, fgd.min_unallocated) == (3, 2.0, 1.5)
    # Against each seed's best baseline: 4 -> 2 (50 %), 5 -> 3 (40 %), 2 -> 1.5 (25 %).
    assert fgd.median_reduction == pytest.approx(0.4)
    assert spreads["best-fit"].median_reduction == pytest.approx(0.0)


def test_cli_inflation_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "seeds.json"
    args = ["inflation", str(PODS), "--nodes", str(NODES), "--policies", "best-fit,fgd"]
    result = CliRunner().invoke(
        sim_app, [*args, "--seeds", "1-2", "--no-progress", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| best-fit |") and "+0.0 %" in rows[1]
    payload = json.loads(out.read_text())
    assert payload["seeds"] == [1, 2] and [p["policy"] for p in payload["policies"]] == [
        "best-fit",
        "fgd",
    ]
    bad = CliRunner().invoke(sim_app, [*args, "--seeds", "3-1"])
    assert bad.exit_code == 2 and "runs backwards" in bad.output


def test_a_pod_list_with_only_resource_columns() -> None:
    full = read_pods(PODS)
    pods = read_pods(RESOURCE_PODS)
    assert len(pods) == 60
    for pod, same in zip(pods, full, strict=False):
        # The same requests; no gpu_spec = any model, no qos = best effort.
        assert (pod.cpu, pod.mem, pod.gpus, pod.milli) == (
            same.cpu,
            same.mem,
            same.gpus,
            same.milli,
        )
        assert pod.models == () and pod.best_effort and pod.checkpointable
    result = run_inflation(NODES, RESOURCE_PODS, "shaper-defrag", seed=3)
    assert result.cluster is not None
    check_cluster(result.cluster)
    assert result.arrived_gpus > result.capacity_gpus  # inflated past the cluster


def test_missing_columns_are_named(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,gpu_milli\np,1000,1024,500\n")
    with pytest.raises(TraceError) as caught:
        read_pods(pods)
    message = str(caught.value)
    assert "the pod list has no column num_gpu" in message
    assert "its columns are ['name', 'cpu_milli', 'memory_mib', 'gpu_milli']" in message
    assert caught.value.about is TraceInput.trace
    garbled = tmp_path / "garbled.csv"
    garbled.write_text("cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,1024,one,0\n")
    with pytest.raises(TraceError, match="garbled.csv:2: num_gpu must be a whole number"):
        read_pods(garbled)
    # As the replay loaders read a pod list: a short row, a negative request or a list
    # with no pod is refused with its line (a short row was a 0-GPU pod, a -1-GPU pod
    # was taken); a byte-order mark reads as plain CSV.
    head = "cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    for name, rows, says in (
        ("short.csv", "1000,1024,1\n", "short.csv:2: 3 fields, but the header has 4"),
        ("negative.csv", "1000,1024,-1,0\n", "negative.csv:2: num_gpu must be a whole number >= 0"),
        ("empty.csv", "", "empty.csv: no jobs: the pod list has no rows"),
    ):
        bad = tmp_path / name
        bad.write_text(head + rows)
        with pytest.raises(TraceError, match=re.escape(says)):
            read_pods(bad)
    marked = tmp_path / "marked.csv"
    marked.write_text("\ufeff" + head + "1000,1024,1,500\n", encoding="utf-8")
    (pod,) = read_pods(marked)
    assert (pod.cpu, pod.mem, pod.gpus, pod.milli) == (1000, 1024, 1, 500)
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,gpu,model\nA,32000,2,T4\n")
    with pytest.raises(TraceError, match="the node list has no column memory_mib") as bad_nodes:
        run_inflation(nodes, RESOURCE_PODS, "fgd")
    assert bad_nodes.value.about is TraceInput.nodes
    big = tmp_path / "big.csv"
    big.write_text("sn,cpu_milli,memory_mib,gpu,model\nA,32000,65536,16,T4\n")
    with pytest.raises(TraceError, match="big.csv:2: 16 GPUs; the experiment models 0 to 8"):
        Cluster(big)


def test_cli_inflation_input_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(
        sim_app,
        ["inflation", str(RESOURCE_PODS), "--nodes", str(NODES), "--policies", "fgd"],
    )
    assert ok.exit_code == 0, ok.output
    assert "fgd" in ok.output
    # No node list next to the pods, none given: say which option to pass.
    pods = tmp_path / "pods.csv"
    pods.write_text(RESOURCE_PODS.read_text())
    alone = runner.invoke(sim_app, ["inflation", str(pods), "--policies", "fgd"])
    assert alone.exit_code == 2
    assert "--nodes" in flat(alone.output) and "pass --nodes" in flat(alone.output)
    assert "No such file" not in alone.output
    missing = runner.invoke(
        sim_app, ["inflation", str(pods), "--nodes", str(tmp_path / "n.csv"), "--policies", "fgd"]
    )
    assert missing.exit_code == 2
    # The panel wraps a long path anywhere (a worker's temporary directory is longer).
    assert f"{tmp_path / 'n.csv'}:nosuchfile" in "".join(flat(missing.output).split())
    no_gpus = tmp_path / "no-gpus.csv"
    no_gpus.write_text("name,cpu_milli,memory_mib,gpu_milli\np,1000,1024,500\n")
    bad = runner.invoke(
        sim_app, ["inflation", str(no_gpus), "--nodes", str(NODES), "--policies", "fgd"]
    )
    assert bad.exit_code == 2
    assert "Invalid value for PODS" in flat(bad.output)
    assert "the pod list has no column num_gpu" in flat(bad.output)
    movable = runner.invoke(
        sim_app, ["inflation", str(PODS), "--nodes", str(NODES), "--movable", "some"]
    )
    assert movable.exit_code == 2 and "--movable" in movable.output
    turn = runner.invoke(
        sim_app, ["inflation", str(PODS), "--nodes", str(NODES), "--solver-cpu-only", "first"]
    )
    assert turn.exit_code == 2 and "--solver-cpu-only" in flat(turn.output)
    assert "arrival, in-order, last" in flat(turn.output)
