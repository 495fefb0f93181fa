"""Traces users bring: every bad file is refused by a :class:`TraceError` that names the
file, the line and the field (or the option to pass), never a bare ``KeyError``,
``ZeroDivisionError`` or ``OSError``, and never loaded as garbage (negative or NaN times,
zero-GPU jobs, repeated ids). What only looks unusual (CRLF, a byte-order mark, columns in
another order, extra columns) loads as the plain file does.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.traces import TraceError, TraceInput, TraceOptions, detect_kind, load_trace, open_trace
from sim.traces.alibaba import read_alibaba_nodes

PHILLY = "timestamp,duration,num_gpus,gpu_time,cluster\n"
POLLUX = "name,time,application,num_replicas,batch_size\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos,creation_time,deletion_time\n"
NATIVE = "id,submit_s,gpus,duration_s\n"
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,262144,8,G1\n"


def gavel(*, steps: str = "7931", scale: str = "1", weight: str = "1", at: str = "0") -> str:
    return f"ResNet-50 (batch size 64)\tcmd\twd\t-n\t1\t{steps}\t{scale}\t{weight}\t-1\t{at}\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


def refused(path: Path, *, kind: str = "auto", nodes: Path | None = None) -> TraceError:
    with pytest.raises(TraceError) as caught:
        load_trace(path, kind=kind, nodes_path=nodes)
    return caught.value


# (file name, content, what the message must say: the file, the line and the field).
BAD_ROWS = [
    ("philly-negative.csv", PHILLY + "2017-10-09 07:01:55,-5,1,-5,a\n", r":2: duration"),
    ("philly-nan.csv", PHILLY + "2017-10-09 07:01:55,nan,1,1,a\n", r":2: duration.*'nan'"),
    ("philly-inf.csv", PHILLY + "2017-10-09 07:01:55,inf,1,1,a\n", r":2: duration.*'inf'"),
    ("philly-gpus.csv", PHILLY + "2017-10-09 07:01:55,5,-1,5,a\n", r":2: num_gpus.*>= 0"),
    ("philly-time.csv", PHILLY + ",5,1,5,a\n", r":2: timestamp must be YYYY-mm-dd HH:MM:SS"),
    ("philly-short.csv", PHILLY + "2017-10-09 07:01:55,5\n", r":2: 2 fields, but the header"),
    ("philly-long.csv", PHILLY + "2017-10-09 07:01:55,5,1,5,a,b\n", r":2: 6 fields"),
    ("pollux-zero.csv", POLLUX + "a,0,cifar10,0,1\n", r":2: num_replicas.*>= 1"),
    ("pollux-neg.csv", POLLUX + "a,-10,cifar10,1,1\n", r":2: time .*>= 0"),
    ("pollux-nan.csv", POLLUX + "a,nan,cifar10,1,1\n", r":2: time .*'nan'"),
    ("pollux-dup.csv", POLLUX + "a,0,cifar10,1,1\na,5,ncf,1,1\n", r":3: job id 'a'.*line 2"),
    ("pollux-short.csv", POLLUX + "a,0\n", r":2: 2 fields"),
    ("gavel-nan.trace", gavel(at="nan"), r":1: arrival time"),
    ("gavel-neg.trace", gavel() + gavel(at="-5"), r":2: arrival time.*>= 0"),
    ("gavel-inf.trace", gavel(steps="inf"), r":1: total steps.*> 0"),
    ("gavel-zero.trace", gavel(steps="0"), r":1: total steps.*> 0"),
    ("gavel-weight.trace", gavel(weight="nan"), r":1: priority weight"),
    ("native-neg.csv", NATIVE + "a,0,1,-5\n", r":2: duration_s .*> 0"),
    ("native-zero-gpus.csv", NATIVE + "a,0,0,5\n", r":2: gpus .*>= 1"),
    ("native-half-gpu.csv", NATIVE + "a,0,1.5,5\n", r":2: gpus must be a whole number"),
    ("native-nan.csv", NATIVE + "a,nan,1,5\nb,0,1,5\n", r":2: submit_s"),
    ("native-inf.csv", NATIVE + "a,0,1,inf\n", r":2: duration_s"),
    ("native-dup.csv", NATIVE + "a,0,1,5\na,1,1,5\n", r":3: job id 'a'.*line 2"),
    ("native-short.csv", NATIVE + "a,0\n", r":2: 2 fields"),
    ("native-bool.csv", "id,submit_s,gpus,duration_s,preemptible\na,0,1,5,maybe\n", "preempt"),
    ("native-prio.csv", "id,submit_s,gpus,duration_s,priority\na,0,1,5,nan\n", ":2: priority"),
    ("native-kind.csv", "id,submit_s,gpus,duration_s,kind\na,0,1,5,foo\n", "kind must be one"),
    ("native-model.csv", "id,submit_s,gpus,duration_s,gpu_models\na,0,1,5,H100\n", "never run"),
    ("native-speed.csv", "id,submit_s,gpus,duration_s,speeds\na,0,1,5,H100\n", ":2: speeds must"),
    ("native-slow.csv", "id,submit_s,gpus,duration_s,speeds\na,0,1,5,H100=0\n", ":2: speeds H100"),
    ("native-fast.csv", "id,submit_s,gpus,duration_s,speeds\na,0,1,5,H100=101\n", "at most 100"),
    (
        "native-nan-speed.csv",
        "id,submit_s,gpus,duration_s,speeds\na,0,1,5,H100=nan\n",
        "speeds H100",
    ),
    (
        "native-speed-model.csv",
        "id,submit_s,gpus,duration_s,speeds\na,0,1,5,B300=2\n",
        "does not have",
    ),
]


@pytest.mark.parametrize(("name", "text", "says"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_a_bad_row_is_refused_with_its_line_and_field(
    tmp_path: Path, name: str, text: str, says: str
) -> None:
    path = write(tmp_path, name, text)
    error = refused(path)
    assert str(error).startswith(str(path)) and re.search(says, str(error)), str(error)
    assert error.about is TraceInput.trace


BAD_PODS = [
    ("p,1000,100,1,1000,BE,100,50\n", r":2: the pod ends \(deletion_time 50\) before it starts"),
    ("p,1000,100,-1,1000,BE,0,50\n", r":2: num_gpu .*>= 0"),
    ("p,1000,100,1,1000,BE,nan,50\n", r":2: creation_time"),
    ("p,1000,100,1,5000,BE,0,50\n", r":2: gpu_milli .*at most 1000"),
    ("p,1000,100,1,1000,BE,0,50\np,1000,100,1,1000,BE,0,50\n", r":3: pod name 'p'.*line 2"),
    ("p,1000,100,1,1000,BE,0,\n", r"no pod has a deletion_time"),
    ("p,1000,100,0,0,BE,0,50\n", r"none of its 1 pods asks for a GPU"),
    ("p,1000,100\n", r":2: 3 fields"),
]


@pytest.mark.parametrize(("rows", "says"), BAD_PODS)
def test_a_bad_alibaba_pod_is_refused_with_its_line(tmp_path: Path, rows: str, says: str) -> None:
    nodes = write(tmp_path, "nodes.csv", NODES)
    pods = write(tmp_path, "pods.csv", PODS + rows)
    error = refused(pods, kind="alibaba", nodes=nodes)
    assert str(error).startswith(str(pods)) and re.search(says, str(error)), str(error)


BAD_NODES = [
    ("n1,32000,262144,-8,G1\n", r":2: gpu .*>= 0"),
    ("n1,32000,262144,8,\n", r":2: the node has 8 GPUs and no model"),
    (",32000,262144,8,G1\n", r":2: sn \(the node's name\) is empty"),
    ("n1,32000,262144,8,G1\nn1,32000,262144,8,G1\n", r":3: node 'n1' is also that of line 2"),
    ("n1,32000,262144,0,\n", r"no node with GPUs"),
]


@pytest.mark.parametrize(("rows", "says"), BAD_NODES)
def test_a_bad_alibaba_node_is_refused_about_the_node_list(
    tmp_path: Path, rows: str, says: str
) -> None:
    nodes = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n" + rows)
    with pytest.raises(TraceError) as caught:
        read_alibaba_nodes(nodes)
    assert re.search(says, str(caught.value)), str(caught.value)
    assert caught.value.about is TraceInput.nodes


@pytest.mark.parametrize(
    ("name", "header"),
    [("philly.csv", PHILLY), ("pollux.csv", POLLUX), ("native.csv", NATIVE), ("pods.csv", PODS)],
)
def test_a_header_without_rows_is_no_trace(tmp_path: Path, name: str, header: str) -> None:
    (tmp_path / "openb_node_list_all_node.csv").write_text(NODES)  # beside the pods
    error = refused(write(tmp_path, name, header))
    assert "no jobs: the file has no rows after its header" in str(error)


def test_an_empty_gavel_file_and_a_philly_file_that_never_ran_are_no_trace(
    tmp_path: Path,
) -> None:
    assert "no job line" in str(refused(write(tmp_path, "e.trace", "\n"), kind="gavel"))
    never = write(tmp_path, "p.csv", PHILLY + "2017-10-09 07:01:55,0,1,0,a\n")
    assert "none of its 1 rows ran: each has 0 GPUs or 0 s" in str(refused(never))


def test_a_directory_a_gzip_file_and_non_utf8_bytes_are_named(tmp_path: Path) -> None:
    for kind in ("auto", "philly", "pollux", "gavel", "native", "alibaba"):
        error = refused(tmp_path, kind=kind)
        assert f"{tmp_path} is a directory; pass the trace file itself" in str(error)
    packed = tmp_path / "philly.csv.gz"
    packed.write_bytes(gzip.compress((PHILLY + "2017-10-09 07:01:55,5,1,5,a\n").encode()))
    for kind in ("auto", "philly"):
        error = refused(packed, kind=kind)
        assert "is gzip-compressed; decompress it first (gunzip -k" in str(error)
    latin = tmp_path / "latin.csv"
    latin.write_bytes((NATIVE + "caf\xe9,0,1,5\n").encode("latin-1"))
    assert "is not UTF-8 text" in str(refused(latin, kind="native"))
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    pods = write(tmp_path, "pods.csv", PODS + "p,1000,100,1,1000,BE,0,50\n")
    error = refused(pods, kind="alibaba", nodes=nodes)
    assert "is a directory" in str(error) and error.about is TraceInput.nodes


def clean_jobs(path: Path, **kw: object) -> list[tuple[str, float, int, float]]:
    workload = load_trace(path, **kw)  # type: ignore[arg-type]
    return [(j.id, j.submit_time, j.gpus, j.work) for j in workload.jobs]


def test_crlf_a_byte_order_mark_and_reordered_or_extra_columns_load_as_the_plain_file(
    tmp_path: Path,
) -> None:
    rows = "2017-10-09 07:01:55,66,1,66,a\n2017-10-09 08:01:55,60,2,120,b\n"
    plain = clean_jobs(write(tmp_path, "plain.csv", PHILLY + rows))
    assert clean_jobs(write(tmp_path, "crlf.csv", (PHILLY + rows).replace("\n", "\r\n"))) == plain
    assert clean_jobs(write(tmp_path, "bom.csv", "\ufeff" + PHILLY + rows)) == plain
    reordered = "cluster,num_gpus,extra,duration,timestamp,gpu_time\n"
    reordered += "a,1,x,66,2017-10-09 07:01:55,66\nb,2,y,60,2017-10-09 08:01:55,120\n"
    assert clean_jobs(write(tmp_path, "reordered.csv", reordered)) == plain
    assert clean_jobs(write(tmp_path, "gap.csv", PHILLY + rows.replace("\n", "\n\n", 1))) == plain
    trace = gavel() + gavel(at="30")
    plain_gavel = clean_jobs(write(tmp_path, "g.trace", trace))
    assert clean_jobs(write(tmp_path, "gb.trace", "\ufeff" + trace.replace("\n", "\r\n"))) == (
        plain_gavel
    )
    assert detect_kind(write(tmp_path, "bom-pollux.csv", "\ufeff" + POLLUX + "a,0,ncf,1,1\n")) == (
        "pollux"
    )
    job = {"id": "a", "submit_s": 0, "gpus": 1, "duration_s": 5}
    json_bom = write(tmp_path, "bom.json", "\ufeff" + json.dumps([job]))
    assert open_trace(json_bom).workload.jobs[0].id == "a"


def test_a_timestamp_with_an_offset_keeps_it(tmp_path: Path) -> None:
    offset = PHILLY + "2017-10-09 07:00:00+02:00,5,1,5,a\n2017-10-09 06:00:00,5,1,5,b\n"
    jobs = clean_jobs(write(tmp_path, "tz.csv", offset))
    # 07:00 at +02:00 is 05:00 UTC, an hour before the second job.
    assert [(j[0], j[1]) for j in jobs] == [("philly-0", 0.0), ("philly-1", 3600.0)]


JOB = {"id": "a", "submit_s": 0, "gpus": 1, "duration_s": 5}
BAD_JSON = [
    (["x"], r"job 0: a job must be an object"),
    (3, r"expected a list of jobs or an object"),
    ({"job": []}, r"unknown keys \['job'\]"),
    ({"jobs": 3}, r"jobs must be a list"),
    ({"jobs": [{"id": "a", "submit_s": 0, "gpus": [1], "duration_s": 5}]}, r"job 0: gpus"),
    ({"jobs": [{"id": "a", "submit_s": 0, "gpus": True, "duration_s": 5}]}, r"job 0: gpus"),
    ({"jobs": [{"id": "a", "submit_s": 0, "gpus": 1, "duration_s": 5}] * 2}, r"job 1: job id"),
    ({"nodes": [{"gpus": 8}], "jobs": [JOB]}, r"nodes\[0\]: missing name"),
    ({"nodes": [{"name": "a", "gpus": 0}], "jobs": [JOB]}, r"nodes\[0\]: gpus"),
    ({"nodes": ["a"], "jobs": [JOB]}, r"nodes\[0\]: a node must be an object"),
    ({"nodes": [{"name": "a", "gpus": 8}] * 2, "jobs": [JOB]}, r"node name 'a'"),
    (
        {"nodes": [{"name": "a", "gpus": 8}], "gpu_models": {"V100": 3}, "jobs": [JOB]},
        r"gpu_models.V100",
    ),
    ({"gpu_models": {"V100": {}}, "jobs": []}, r"gpu_models describes the models of nodes"),
    ({"services": [{"id": "s"}]}, r"services\[0\]: missing 'hourly_demand'"),
    ({"jobs": []}, r"no jobs and no services"),
]


@pytest.mark.parametrize(("data", "says"), BAD_JSON)
def test_a_bad_json_trace_is_refused_with_the_entry(
    tmp_path: Path, data: object, says: str
) -> None:
    path = write(tmp_path, "trace.json", json.dumps(data))
    error = refused(path)
    assert str(error).startswith(str(path)) and re.search(says, str(error)), str(error)


def test_json_nan_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "nan.json", '[{"id": "a", "submit_s": NaN, "gpus": 1, "duration_s": 5}]')
    assert "job 0: submit_s (seconds) must be a finite number" in str(refused(path))


def test_jobs_all_larger_than_the_cluster_name_the_option(tmp_path: Path) -> None:
    path = write(tmp_path, "big.csv", NATIVE + "a,0,16,5\n")
    with pytest.raises(TraceError) as caught:
        load_trace(path, options=TraceOptions(gpus=8))
    assert "more GPUs than the replay cluster's 8" in str(caught.value)
    assert caught.value.about is TraceInput.cluster


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (TraceOptions(load_scale=0), "--load-scale must be a finite number > 0"),
        (TraceOptions(load_scale=-2), "--load-scale"),
        (TraceOptions(duration_scale=float("nan")), "--duration-scale"),
        (TraceOptions(subsample=0), "--subsample"),
        (TraceOptions(max_jobs=-3), "--max-jobs must be at least 1"),
        (TraceOptions(window_start_h=5, window_end_h=2), "--window-end-h must be after"),
        (TraceOptions(window_start_h=1000), "no job is left of the trace's 2"),
        (TraceOptions(horizon_h=0), "--horizon-h"),
    ],
)
def test_options_that_shape_a_trace_into_garbage_are_refused(
    tmp_path: Path, options: TraceOptions, says: str
) -> None:
    path = write(tmp_path, "ok.csv", NATIVE + "a,0,1,5\nb,60,1,5\n")
    with pytest.raises(TraceError, match=re.escape(says)) as caught:
        load_trace(path, options=options)
    # About the options, not the file: the CLI and the what-if form point there.
    assert caught.value.about is TraceInput.options


runner = CliRunner()


def test_replay_reports_bad_input_as_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    zero = write(tmp_path, "zero.csv", POLLUX + "a,0,cifar10,0,1\n")
    for args in (
        [str(zero)],
        [str(tmp_path)],
        [str(write(tmp_path, "ok.csv", NATIVE + "a,0,1,5\n")), "--load-scale", "0"],
    ):
        result = runner.invoke(sim_app, ["replay", *args, "--no-progress"])
        assert result.exit_code == 2, (args, result.output, result.exception)
    assert "num_replicas must be a whole number >= 1" in " ".join(
        runner.invoke(sim_app, ["replay", str(zero)]).output.split()
    )
    scaled = runner.invoke(sim_app, ["replay", str(tmp_path / "ok.csv"), "--load-scale", "0"])
    assert "the trace's options" in scaled.output and "TRACE" not in scaled.output
