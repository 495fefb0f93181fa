"""Trace loaders on excerpts of the real trace files (see data/README.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.actions import Start
from sim.engine import Simulation
from sim.run import simulate
from sim.traces import (
    Elasticity,
    TraceError,
    TraceInput,
    TraceOptions,
    detect_kind,
    load_native,
    load_trace,
    open_trace,
    read_philly,
    read_pollux,
)
from sim.traces.alibaba import QOS_PRIORITY, read_alibaba_nodes, read_alibaba_pods
from sim.traces.gavel import SPEED
from sim.traces.gavel_throughputs import STEPS_PER_SECOND
from sim.traces.pollux import APPLICATION_GPU_HOURS

from .builders import ScriptedPlanner, at

DATA = Path(__file__).parent / "data"
PHILLY = DATA / "philly-sample.csv"
POLLUX = DATA / "pollux-workload-1.csv"
NODES = DATA / "alibaba-nodes-sample.csv"
PODS = DATA / "alibaba-pods-sample.csv"
RESOURCE_PODS = DATA / "alibaba-pods-resources-only.csv"
GAVEL = DATA / "gavel-artifact-evaluation.trace"
HOUR_S = 3600.0


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def gavel_lines(path: Path) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in path.read_text().splitlines()]


def test_detect_kind() -> None:
    assert detect_kind(PHILLY) == "philly"
    assert detect_kind(POLLUX) == "pollux"
    assert detect_kind(PODS) == "alibaba"
    assert detect_kind(RESOURCE_PODS) == "alibaba"
    assert detect_kind(GAVEL) == "gavel"


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


def test_pollux_replays_on_its_testbed_unless_told() -> None:
    default = open_trace(POLLUX)
    assert default.workload.total_gpus == 64
    assert len(default.workload.nodes) == 16 and {n.gpus for n in default.workload.nodes} == {4}
    assert default.cluster.startswith("16 nodes × 4 V100 GPUs (Pollux's testbed")
    assert "the loader's default" in default.cluster
    wider = open_trace(POLLUX, options=TraceOptions(gpus_per_node=8))
    assert wider.workload.total_gpus == 64 and {n.gpus for n in wider.workload.nodes} == {8}
    assert wider.cluster.startswith("8 nodes × 8 V100 GPUs (--gpus-per-node 8; 64 GPUs as")
    smaller = load_trace(POLLUX, options=TraceOptions(gpus=32))
    assert [n.gpus for n in smaller.nodes] == [4] * 8
    uneven = open_trace(POLLUX, options=TraceOptions(gpus=10, gpus_per_node=4))
    assert [n.gpus for n in uneven.workload.nodes] == [4, 4, 2]
    assert uneven.cluster.startswith("2 nodes × 4 + 1 node × 2 V100 GPUs (10 GPUs)")
    with pytest.raises(TraceError, match="--gpus-per-node must be at least 1") as bad:
        load_trace(POLLUX, options=TraceOptions(gpus_per_node=0))
    assert bad.value.about is TraceInput.cluster


def test_every_loader_without_nodes_takes_the_cluster_size() -> None:
    options = TraceOptions(gpus=24, gpus_per_node=2)
    for path in (PHILLY, POLLUX, GAVEL):
        wl = load_trace(path, options=options)
        assert wl.total_gpus == 24 and {n.gpus for n in wl.nodes} == {2}, path
    # Philly's default: 64 GPUs in nodes of 8.
    philly = open_trace(PHILLY)
    assert philly.workload.total_gpus == 64 and {n.gpus for n in philly.workload.nodes} == {8}
    assert "Shaper's default for Philly" in philly.cluster


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


def test_a_native_trace_gives_each_job_its_own_speeds(tmp_path: Path) -> None:
    """``speeds`` (``MODEL=SPEED|…``; in JSON also an object), as a live job's
    ``shaper.io/speeds``: the job runs ``duration_s / SPEED`` on that model."""
    nodes = [
        {"name": "h", "gpus": 8, "gpu_model": "H100"},
        {"name": "a", "gpus": 8, "gpu_model": "A100"},
    ]
    models = {"H100": {"speed": 3.0}, "A100": {"speed": 1.0}}
    jobs = [
        {"id": "mem", "submit_s": 0, "gpus": 8, "duration_s": 3600, "gpu_models": "H100",
         "speeds": "H100=1"},
        {"id": "obj", "submit_s": 0, "gpus": 8, "duration_s": 3600, "gpu_models": ["H100"],
         "speeds": {"H100": 1.5}},
        {"id": "plain", "submit_s": 10_000, "gpus": 8, "duration_s": 3600, "gpu_models": "H100"},
    ]  # fmt: skip
    path = tmp_path / "site.json"
    path.write_text(json.dumps({"nodes": nodes, "gpu_models": models, "jobs": jobs}))
    workload = load_trace(path)
    assert {j.id: j.speeds for j in workload.jobs} == {
        "mem": (("H100", 1.0),),
        "obj": (("H100", 1.5),),
        "plain": (),
    }
    sim = simulate(workload, "fifo", check_invariants=True)
    runs = {
        job_id: job.end_time - job.first_start
        for job_id, job in sim.jobs.items()
        if job.end_time is not None and job.first_start is not None
    }
    assert runs == pytest.approx({"mem": 3600.0, "obj": 2400.0, "plain": 1200.0})
    csv_path = tmp_path / "site.csv"
    csv_path.write_text("id,submit_s,gpus,duration_s,speeds\nj1,0,1,60,H100=2.5|H100=3\n")
    (j1,) = load_trace(csv_path, options=TraceOptions(gpus=8, gpu_model="H100")).jobs
    assert j1.speeds == (("H100", 3.0),)  # the later entry for a model wins


def test_bad_files_say_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,submit_s,gpus,duration_s\nj1,0,x,10\n")
    with pytest.raises(ValueError, match="bad.csv:2"):
        load_trace(bad)
    unknown = tmp_path / "what.csv"
    unknown.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot tell"):
        load_trace(unknown)


def test_a_csv_without_the_columns_names_them(tmp_path: Path) -> None:
    # Philly, Pollux and Shaper's CSV share one header check: the missing columns (sorted),
    # the ones found, and for a source's own loader what the file is not.
    half = tmp_path / "half.csv"
    half.write_text("name,time\nj1,0\n")
    with pytest.raises(TraceError) as philly:
        read_philly(half, TraceOptions())
    assert str(philly.value) == (
        f"{half}: not a Philly trace, missing columns "
        "['cluster', 'duration', 'gpu_time', 'num_gpus', 'timestamp'] (found ['name', 'time'])"
    )
    with pytest.raises(TraceError) as pollux:
        read_pollux(half, TraceOptions())
    assert str(pollux.value) == (
        f"{half}: not a Pollux workload, missing columns ['application', 'num_replicas'] "
        "(found ['name', 'time'])"
    )
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError) as native:
        load_native(empty)
    assert str(native.value) == (
        f"{empty}: missing columns ['duration_s', 'gpus', 'id', 'submit_s'] (found [])"
    )
    assert philly.value.about is pollux.value.about is native.value.about is TraceInput.trace


def test_an_unknown_format_names_the_known_ones(tmp_path: Path) -> None:
    unknown = tmp_path / "what.csv"
    unknown.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError) as caught:
        load_trace(unknown)
    message = str(caught.value)
    assert (
        f"cannot tell the trace format of {unknown}: its first line has the fields ['a', 'b']"
        in message
    )
    assert message.endswith("; pass --kind") and caught.value.about is TraceInput.kind
    for known in (
        "philly (CSV: timestamp, duration, num_gpus)",
        "pollux (CSV: name, time, application, num_replicas)",
        "alibaba (pod list CSV: cpu_milli, memory_mib, num_gpu, gpu_milli",
        "native (CSV: id, submit_s, gpus, duration_s",
        "gavel (no header, 10 tab-separated fields: job type, command, working directory",
    ):
        assert known in message
    # A job line of a tab-separated format it does not know: its fields, cut short.
    tabs = tmp_path / "jobs.trace"
    tabs.write_text("\t".join(["ResNet (batch size 8)", "x" * 100, "3"]) + "\n")
    with pytest.raises(TraceError, match=r"fields \['ResNet \(batch size 8\)', 'xxx") as cut:
        load_trace(tabs)
    assert "x" * 50 not in str(cut.value)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match="first line is empty"):
        load_trace(empty)


def test_gavel_maps_fields() -> None:
    lines = gavel_lines(GAVEL)
    wl = load_trace(GAVEL)
    assert len(wl.jobs) == len(lines) == 15
    by_id = {job.id: job for job in wl.jobs}
    for index, fields in enumerate(lines):
        job = by_id[f"gavel-{index}"]
        job_type, steps, scale = fields[0], float(fields[5]), int(fields[6])
        v100 = STEPS_PER_SECOND[(job_type, 1)][0]
        assert job.gpus == scale
        # Run time on the reference V100; a job on s GPUs runs s times faster (assumed).
        assert job.work == pytest.approx(steps / (scale * v100))
        assert job.priority == float(fields[7]) and job.submit_time == 0
        assert job.team == job_type.split(" (")[0]
        assert job.gpu_models == ()  # every job of the sample fits every model
    assert sorted({j.gpus for j in wl.jobs}) == [1, 2]


def test_gavel_cluster_is_its_papers_unless_told() -> None:
    default = open_trace(GAVEL)
    wl = default.workload
    assert [n.gpu_model for n in wl.nodes].count("V100") == 36
    assert [n.gpu_model for n in wl.nodes].count("P100") == 36
    assert [n.gpu_model for n in wl.nodes].count("K80") == 36
    assert {n.gpus for n in wl.nodes} == {1} and wl.total_gpus == 108
    assert default.cluster.startswith("36 nodes × 1 V100 + 36 nodes × 1 P100 + 36 nodes × 1 K80")
    assert "Gavel's simulated cluster (OSDI'20), the loader's default" in default.cluster
    assert wl.gpu_models["V100"].speed == 1.0
    assert 0 < wl.gpu_models["K80"].speed < wl.gpu_models["P100"].speed < 1.0
    assert wl.gpu_models["P100"].speed == SPEED["P100"]
    resized = load_trace(GAVEL, options=TraceOptions(gpus=64, gpus_per_node=4))
    by_model = {m: [n.gpus for n in resized.nodes if n.gpu_model == m] for m in SPEED}
    assert by_model == {"V100": [4] * 5 + [2], "P100": [4] * 5 + [1], "K80": [4] * 5 + [1]}


def test_gavel_formats_and_constraints(tmp_path: Path) -> None:
    def line(job_type: str, steps: int, scale: int, arrival: float, *, old: bool = False) -> str:
        fields = [job_type, "python3 main.py", "workdir", "--steps", "1", str(steps), str(scale)]
        fields += ["5", "-1.000000", str(arrival)]
        if old:  # before Gavel added the working directory
            del fields[2]
        return "\t".join(fields) + "\n"

    trace = tmp_path / "mixed.trace"
    trace.write_text(
        line("ResNet-50 (batch size 128)", 2530, 1, 30.0)
        + line("A3C", 748, 1, 90.0, old=True)
        + "\n"
        + line("LM (batch size 5)", 1000, 4, 200.0)
    )
    assert detect_kind(trace) == "gavel"
    big, a3c, lm = load_trace(trace).jobs
    # It does not fit a K80 (throughput 0 there).
    assert big.gpu_models == ("V100", "P100") and big.work == pytest.approx(1000, rel=1e-3)
    assert a3c.submit_time == 60 and a3c.work == pytest.approx(100, rel=1e-3)
    assert a3c.priority == 5.0 and lm.gpus == 4 and lm.submit_time == 170
    unknown = tmp_path / "unknown.trace"
    unknown.write_text(line("A3C", 10, 1, 0) + line("GPT-9 (batch size 1)", 10, 1, 0))
    with pytest.raises(TraceError, match=r"unknown.trace:2: job type 'GPT-9 \(batch size 1\)'"):
        load_trace(unknown, kind="gavel")
    short = tmp_path / "short.trace"
    short.write_text(line("A3C", 10, 1, 0) + "A3C\tpython3\t1\n")
    with pytest.raises(TraceError, match="short.trace:2: 3 tab-separated fields, not 10"):
        load_trace(short, kind="gavel")


def test_gavel_jobs_progress_at_their_own_job_type_s_speed(tmp_path: Path) -> None:
    # Two job types, each one hour of work on a V100; on a K80 each runs at its own type's
    # throughput over its V100 throughput, not the K80's mean over all types.
    types = ("ResNet-18 (batch size 256)", "LM (batch size 5)")
    fields = [[t, "cmd", "dir", "--steps", "0", "", "1", "1", "-1", "0"] for t in types]
    for row, job_type in zip(fields, types, strict=True):
        row[5] = repr(STEPS_PER_SECOND[(job_type, 1)][0] * HOUR_S)
    trace = tmp_path / "two.trace"
    trace.write_text("".join("\t".join(row) + "\n" for row in fields))
    wl = load_trace(trace, kind="gavel")
    resnet, lm = wl.jobs
    for job, job_type in ((resnet, types[0]), (lm, types[1])):
        v100, p100, k80 = STEPS_PER_SECOND[(job_type, 1)]
        assert job.work == pytest.approx(HOUR_S)
        assert job.speeds == (("V100", 1.0), ("P100", p100 / v100), ("K80", k80 / v100))
    planner = ScriptedPlanner(
        at({0: [Start(resnet.id, {"k80-000": 1}), Start(lm.id, {"k80-001": 1})]})
    )
    sim = Simulation(wl, planner, check_invariants=True).run()
    for job, job_type in ((resnet, types[0]), (lm, types[1])):
        v100, _, k80 = STEPS_PER_SECOND[(job_type, 1)]
        assert sim.jobs[job.id].end_time == pytest.approx(HOUR_S * v100 / k80)
    # ResNet-18 (256) gains 12.7x from a V100 over a K80, LM (5) 4.4x; the K80's mean
    # speed (about 0.22) would have made both take about 4.6 h.
    assert sim.jobs[resnet.id].end_time / HOUR_S == pytest.approx(12.70, abs=0.01)
    assert sim.jobs[lm.id].end_time / HOUR_S == pytest.approx(4.37, abs=0.01)


def test_gavel_replay_runs_on_three_models() -> None:
    wl = load_trace(GAVEL, options=TraceOptions(replan_interval_min=60))
    sim = simulate(wl, "shaper", check_invariants=True)
    assert sim.counters.rejected_actions == 0
    assert len(sim.jobs) == len(wl.jobs)


def test_alibaba_node_list_and_cluster_size_errors(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(PODS.read_text())
    with pytest.raises(TraceError, match="pass --nodes") as missing:
        load_trace(pods)
    assert missing.value.about is TraceInput.nodes
    assert "No such file" not in str(missing.value)
    with pytest.raises(TraceError, match="node list .*nowhere.csv: no such file"):
        load_trace(pods, nodes_path=tmp_path / "nowhere.csv")
    with pytest.raises(TraceError, match="--gpus and --gpus-per-node do not apply") as sized:
        load_trace(PODS, nodes_path=NODES, options=TraceOptions(gpus=64))
    assert sized.value.about is TraceInput.cluster
    with pytest.raises(TraceError, match="--nodes is the node list of an Alibaba pod list"):
        load_trace(PHILLY, nodes_path=NODES)
    listed = tmp_path / "listed.json"
    listed.write_text(
        json.dumps(
            {
                "nodes": [{"name": "a", "gpus": 8}],
                "jobs": [{"id": "x", "submit_s": 0, "gpus": 1, "duration_s": 60}],
            }
        )
    )
    assert open_trace(listed).cluster == "1 node × 8 V100 GPUs (the trace's own node list)"
    with pytest.raises(TraceError, match="lists its nodes"):
        load_trace(listed, options=TraceOptions(gpus_per_node=4))


def test_alibaba_pod_columns(tmp_path: Path) -> None:
    # A replay needs run times: a resource-only list is refused, naming what is missing.
    with pytest.raises(TraceError) as caught:
        load_trace(RESOURCE_PODS, nodes_path=NODES)
    message = str(caught.value)
    assert "has no column deletion_time" in message
    assert "its columns are ['name', 'cpu_milli', 'memory_mib', 'num_gpu', 'gpu_milli']" in message
    # Without creation times (and names, models, QoS) the file's order is the arrival order.
    timed = tmp_path / "timed.csv"
    timed.write_text(
        "cpu_milli,memory_mib,num_gpu,gpu_milli,deletion_time\n"
        "1000,1024,1,500,100\n"
        "1000,1024,0,0,100\n"
        "2000,2048,2,1000,300\n"
    )
    first, third = read_alibaba_pods(timed, TraceOptions(), shape=False)
    assert (first.id, first.submit_time, first.work) == ("pod-0", 0.0, 100.0)
    assert (third.id, third.submit_time, third.work) == ("pod-2", 2.0, 298.0)
    assert first.gpu_models == () and first.team == "BE" and first.preemptible


def test_elastic_makes_a_replays_checkpointable_jobs_elastic_training() -> None:
    options = TraceOptions(max_jobs=20, elastic=Elasticity(low=0.5, high=2.0, scaling=0.8))
    jobs = load_trace(POLLUX, options=options).jobs
    rigid = {j.id: j for j in load_trace(POLLUX, options=TraceOptions(max_jobs=20)).jobs}
    assert len(jobs) == 20 and all(j.elastic for j in jobs)
    for j in jobs:
        assert (j.min_gpus, j.max_gpus, j.scaling) == (max(1, j.gpus // 2), 2 * j.gpus, 0.8)
        assert (j.gpus, j.work) == (rigid[j.id].gpus, rigid[j.id].work)  # what it asks
    kept = load_trace(POLLUX, options=options.with_(checkpointable=False)).jobs
    assert not any(j.elastic for j in kept)  # a restart at a new size needs a checkpoint
