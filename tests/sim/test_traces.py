"""Trace loaders on excerpts of the real trace files (see data/README.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.run import simulate
from sim.traces import TraceOptions, detect_kind, load_trace, read_philly
from sim.traces.alibaba import QOS_PRIORITY, read_alibaba_nodes, read_alibaba_pods
from sim.traces.pollux import APPLICATION_GPU_HOURS

DATA = Path(__file__).parent / "data"
PHILLY = DATA / "philly-sample.csv"
POLLUX = DATA / "pollux-workload-1.csv"
NODES = DATA / "alibaba-nodes-sample.csv"
PODS = DATA / "alibaba-pods-sample.csv"


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_detect_kind() -> None:
    assert detect_kind(PHILLY) == "philly"
    assert detect_kind(POLLUX) == "pollux"
    assert detect_kind(PODS) == "alibaba"


def test_philly_maps_columns() -> None:
    raw = rows(PHILLY)
    wl = load_trace(PHILLY, options=TraceOptions(gpus=256))
    assert len(wl.jobs) == len(raw)
    assert sum(j.gpus for j in wl.jobs) == sum(int(r["num_gpus"]) for r in raw)
    assert sum(j.work * j.gpus for j in wl.jobs) == pytest.approx(
        sum(float(r["gpu_time"]) for r in raw)
    )
    assert {j.team for j in wl.jobs} == {r["cluster"] for r in raw}
    assert min(j.submit_time for j in wl.jobs) == 0
    assert wl.total_gpus == 256 and all(n.gpus == 8 for n in wl.nodes)


def test_philly_window_subsample_scale() -> None:
    base = read_philly(PHILLY, TraceOptions())
    span_h = max(j.submit_time for j in base) / 3600
    windowed = read_philly(PHILLY, TraceOptions(window_start_h=span_h / 4, window_end_h=span_h / 2))
    assert 0 < len(windowed) < len(base)
    assert max(j.submit_time for j in windowed) <= span_h / 4 * 3600
    half = read_philly(PHILLY, TraceOptions(subsample=0.5, seed=3))
    assert 0.3 * len(base) < len(half) < 0.7 * len(base)
    assert [j.id for j in half] == [
        j.id for j in read_philly(PHILLY, TraceOptions(subsample=0.5, seed=3))
    ]
    fast = read_philly(PHILLY, TraceOptions(load_scale=2.0, duration_scale=0.5))
    assert max(j.submit_time for j in fast) == pytest.approx(max(j.submit_time for j in base) / 2)
    assert sum(j.work for j in fast) == pytest.approx(sum(max(1.0, j.work / 2) for j in base))
    assert len(read_philly(PHILLY, TraceOptions(max_jobs=10))) == 10


def test_jobs_larger_than_the_cluster_are_left_out() -> None:
    wl = load_trace(PHILLY, options=TraceOptions(gpus=8))
    assert all(j.gpus <= 8 for j in wl.jobs)
    assert len(wl.jobs) == sum(1 for r in rows(PHILLY) if int(r["num_gpus"]) <= 8)
    assert "left out" in wl.description


def test_pollux_maps_applications() -> None:
    raw = rows(POLLUX)
    wl = load_trace(POLLUX)
    assert wl.total_gpus == 64 and all(n.gpus == 4 for n in wl.nodes)
    assert len(wl.jobs) == len(raw)
    by_id = {j.id: j for j in wl.jobs}
    for r in raw:
        j = by_id[r["name"]]
        assert j.gpus == int(r["num_replicas"])
        assert j.work * j.gpus == pytest.approx(APPLICATION_GPU_HOURS[r["application"]] * 3600)


def test_alibaba_nodes_and_pods() -> None:
    models, nodes = read_alibaba_nodes(NODES)
    raw_nodes = [r for r in rows(NODES) if int(r["gpu"]) > 0]
    assert len(nodes) == len(raw_nodes)
    assert set(models) == {r["model"] for r in raw_nodes}
    pods = read_alibaba_pods(PODS, TraceOptions(), shape=False)
    raw = [r for r in rows(PODS) if int(r["num_gpu"]) > 0]
    assert len(pods) == len(raw)
    for pod, r in zip(
        sorted(pods, key=lambda p: p.id), sorted(raw, key=lambda r: r["name"]), strict=True
    ):
        assert pod.priority == QOS_PRIORITY[r["qos"]]
        assert pod.preemptible == (r["qos"] == "BE")
        if int(r["num_gpu"]) == 1:
            assert pod.gpu_milli == int(r["gpu_milli"])


def test_alibaba_replay_runs_on_the_node_list() -> None:
    options = TraceOptions(max_jobs=60, horizon_h=24 * 14, replan_interval_min=12 * 60)
    wl = load_trace(PODS, nodes_path=NODES, options=options)
    assert wl.total_gpus == sum(int(r["gpu"]) for r in rows(NODES))
    sim = simulate(wl, "shaper", check_invariants=True)
    assert sim.counters.rejected_actions == 0
    assert len(sim.jobs) == sum(1 for j in wl.jobs if j.submit_time <= wl.horizon)
    assert sim.counters.replans > 0


def test_native_csv_and_json(tmp_path: Path) -> None:
    csv_path = tmp_path / "site.csv"
    csv_path.write_text(
        "id,submit_s,gpus,duration_s,priority,kind,gpu_models,checkpointable\n"
        "j1,100,4,7200,3,training,H100|A100,true\n"
        "j2,160,1,60,,batch_inference,,no\n"
    )
    wl = load_trace(csv_path, options=TraceOptions(gpus=16, gpu_model="H100"))
    j1, j2 = wl.jobs
    assert (j1.submit_time, j1.gpus, j1.work, j1.priority) == (0, 4, 7200, 3)
    assert j1.gpu_models == ("H100", "A100") and j1.checkpointable
    assert j2.submit_time == 60 and not j2.checkpointable and j2.priority == 1
    json_path = tmp_path / "site.json"
    json_path.write_text(
        json.dumps(
            {
                "nodes": [{"name": "a", "gpus": 8, "gpu_model": "H100"}],
                "gpu_models": {"H100": {"speed": 2.0}},
                "jobs": [{"id": "x", "submit_s": 5, "gpus": 2, "duration_s": 3600}],
                "services": [{"id": "s", "hourly_demand": [1, 2]}],
            }
        )
    )
    wl = load_trace(json_path)
    assert [n.name for n in wl.nodes] == ["a"] and wl.gpu_models["H100"].speed == 2.0
    assert wl.jobs[0].id == "x" and wl.services[0].hourly_demand == (1, 2)


def test_bad_files_say_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,submit_s,gpus,duration_s\nj1,0,x,10\n")
    with pytest.raises(ValueError, match="bad.csv:2"):
        load_trace(bad)
    unknown = tmp_path / "what.csv"
    unknown.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot tell"):
        load_trace(unknown)
