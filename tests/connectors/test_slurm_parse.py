"""Parsing Slurm 22.05's JSON (recorded outputs, see data/README.md) into Shaper's types."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from connectors.base import ConnectorError
from connectors.slurm.config import MappingRule, SlurmMapping
from connectors.slurm.hostlist import expand_hostlist, expand_index_list
from connectors.slurm.parse import (
    LABEL_PARTITIONS,
    LABEL_REASON,
    SlurmJob,
    api_version,
    parse_gres,
    parse_jobs,
    parse_nodes,
    parse_tags,
    time_limit_s,
)
from connectors.slurm.reservations import (
    SlurmReservation,
    duration_minutes,
    job_of,
    parse_reservations,
)
from connectors.slurm.stamps import PIN, STEP, Pin, read_pin, stamp, with_stamp
from wire.telemetry import AllocationReport, JobKind, JobState, NodeState

DATA = Path(__file__).parent / "data"
SHARED = DATA / "slurm-22.05-shared"
RECORDED = DATA / "slurm-22.05-recorded"
VERSIONS = ("v0.0.36", "v0.0.37", "v0.0.38")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def recorded_nodes(version: str, mapping: SlurmMapping | None = None):
    partitions = load(RECORDED / f"rest-partitions-{version}.json")
    return parse_nodes(
        load(RECORDED / f"rest-nodes-{version}.json"),
        mapping or SlurmMapping(),
        partitions_document=partitions if version == "v0.0.36" else None,
    )


def recorded_jobs(version: str, mapping: SlurmMapping | None = None) -> dict[str, SlurmJob]:
    jobs = parse_jobs(load(RECORDED / f"rest-jobs-{version}.json"), mapping or SlurmMapping())
    return {job.report.external_id: job for job in jobs}


# --- hostlists and GRES ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node1", ["node1"]),
        ("node[2-3],gpu7", ["node2", "node3", "gpu7"]),
        ("n[08-10,12]", ["n08", "n09", "n10", "n12"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(expression: str, names: list[str]) -> None:
    assert expand_hostlist(expression) == names


@pytest.mark.parametrize("expression", ["node[1-3", "node1-3]", "node[3-1]", "node[a-b]"])
def test_expand_hostlist_refuses_malformed(expression: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(expression)


def test_expand_index_list() -> None:
    assert expand_index_list("0-1,3") == [0, 1, 3]
    assert expand_index_list("") == []


@pytest.mark.parametrize(
    ("gres", "parsed"),
    [
        ("gpu:h100:2", [("h100", 2)]),
        ("gpu:2", [(None, 2)]),
        ("gpu", [(None, 1)]),
        ("gpu:a100", [("a100", 1)]),
        ("gpu:h100:2(S:0-1),gpu:a100:4(S:0,2)", [("h100", 2), ("a100", 4)]),
        ("gres:gpu:1", [(None, 1)]),
        ("gres/gpu:h100:3", [("h100", 3)]),
        ("shard:8,gpu:1", [(None, 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(gres: str, parsed: list[tuple[str | None, int]]) -> None:
    assert parse_gres(gres) == parsed


# --- API versions ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_api_version_of_each_recording(version: str) -> None:
    for endpoint in ("jobs", "nodes", "partitions"):
        document = load(RECORDED / f"rest-{endpoint}-{version}.json")
        assert api_version(document, what=endpoint) == version


def test_unknown_api_version_is_refused_with_a_clear_message() -> None:
    document = load(RECORDED / "rest-jobs-v0.0.38.json")
    document["meta"]["plugin"]["type"] = "openapi/v0.0.39"  # Slurm 23.02's, never measured
    with pytest.raises(ConnectorError, match=r"openapi/v0\.0\.39.*knows v0\.0\.36") as caught:
        parse_jobs(document, SlurmMapping())
    assert caught.value.retryable is False
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.43"  # Slurm 25.05's
    with pytest.raises(ConnectorError, match=r"data_parser/v0\.0\.43.*to 24\.11"):
        parse_jobs(document, SlurmMapping())


def test_answer_without_version_is_refused() -> None:
    with pytest.raises(ConnectorError, match="cannot tell its API version"):
        parse_nodes({"nodes": []}, SlurmMapping())


def test_errors_in_an_answer_are_retryable() -> None:
    # What squeue --json prints (exit 0) while slurmctld is down.
    document = load(SHARED / "squeue.json")
    document["errors"] = [
        {
            "description": "Failed while looking for jobs",
            "error_number": -1,
            "error": "Unspecified error",
            "source": "slurm_load_jobs",
        }
    ]
    with pytest.raises(ConnectorError, match="slurm_load_jobs: Failed while looking") as caught:
        parse_jobs(document, SlurmMapping())
    assert caught.value.retryable is True


# --- nodes ---------------------------------------------------------------------------------------


def test_shared_sinfo_untyped_gres_uses_the_default_model() -> None:
    nodes = parse_nodes(load(SHARED / "sinfo.json"), SlurmMapping(default_gpu_model="gpu-x"))
    assert [node.name for node in nodes] == ["node1", "node2", "node3"]
    for node in nodes:
        assert (node.gpu_model, node.gpu_count) == ("gpu-x", 2)
        assert (node.cpu_cores, node.memory_mib) == (4, 4000)
        assert node.labels[LABEL_PARTITIONS] == "debug,high"
        assert node.state is NodeState.up


def test_untyped_gres_takes_the_model_from_a_node_feature() -> None:
    document = load(SHARED / "sinfo.json")
    document["nodes"][0]["active_features"] = "ib,A100"
    mapping = SlurmMapping(gpu_model_aliases={"A100": "A100-80GB"})
    nodes = parse_nodes(document, mapping)
    assert nodes[0].gpu_model == "A100-80GB"
    assert nodes[1].gpu_model == mapping.default_gpu_model


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_nodes(version: str) -> None:
    nodes = {node.name: node for node in recorded_nodes(version)}
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for node in nodes.values():
        assert (node.gpu_model, node.gpu_count, node.cpu_cores, node.memory_mib) == (
            "h100",
            2,
            4,
            4000,
        )
        assert node.labels[LABEL_PARTITIONS] == "debug,high"
    assert nodes["node3"].state is NodeState.draining
    assert nodes["node3"].labels[LABEL_REASON] == "maint-window"
    assert nodes["node1"].state is nodes["node2"].state is NodeState.up


def test_node_states_from_base_state_and_flags() -> None:
    document = load(RECORDED / "rest-nodes-v0.0.38.json")
    cases = [
        ("idle", [], NodeState.up),
        ("mixed", [], NodeState.up),
        ("allocated", ["DRAIN"], NodeState.draining),
        ("idle", ["DRAIN"], NodeState.draining),
        ("down", [], NodeState.down),
        ("idle", ["NOT_RESPONDING"], NodeState.down),
        ("mixed", ["DRAIN", "NOT_RESPONDING"], NodeState.down),
        ("future", [], NodeState.down),
        ("idle", ["POWERED_DOWN"], NodeState.down),
    ]
    template = document["nodes"][0]
    document["nodes"] = []
    for position, (state, flags, _) in enumerate(cases):
        node = copy.deepcopy(template)
        node.update(name=f"n{position}", state=state, state_flags=flags, reason="")
        document["nodes"].append(node)
    assert [node.state for node in parse_nodes(document, SlurmMapping())] == [
        expected for *_, expected in cases
    ]


def test_v0_0_36_nodes_need_the_partition_list() -> None:
    with pytest.raises(ConnectorError, match="no partitions"):
        parse_nodes(load(RECORDED / "rest-nodes-v0.0.36.json"), SlurmMapping())


# --- jobs ----------------------------------------------------------------------------------------


def test_shared_squeue_jobs() -> None:
    jobs = {
        job.report.external_id: job
        for job in parse_jobs(load(SHARED / "squeue.json"), SlurmMapping())
    }
    single, gang, pending = jobs["1"].report, jobs["2"].report, jobs["3"].report
    assert single.state is JobState.running
    assert single.allocations == [AllocationReport(node="node1", gpu_indices=[0])]
    assert single.gpus_requested == 1
    assert single.submit_time == datetime.fromtimestamp(1796202497, tz=UTC)
    assert single.start_time == datetime.fromtimestamp(1796202498, tz=UTC)
    assert single.end_time is None  # a running job's end_time is only its time limit
    assert (single.team, single.queue, single.kind) == ("root", "debug", JobKind.hpc)

    assert gang.gang_size == 2 and gang.gpus_requested == 4
    assert gang.allocations == [
        AllocationReport(node="node2", gpu_indices=[0, 1]),
        AllocationReport(node="node3", gpu_indices=[0, 1]),
    ]
    assert pending.state is JobState.pending and pending.allocations == []
    assert pending.gpus_requested == 1  # --gpus=1 is a per-job request
    assert pending.start_time is None
    assert jobs["3"].reason == "Resources"


def test_shared_rest_jobs_restart_counts_and_terminal_states() -> None:
    jobs = {
        job.report.external_id: job
        for job in parse_jobs(load(SHARED / "rest_jobs_jwt.json"), SlurmMapping())
    }
    assert jobs["1"].restart_count == 2
    assert jobs["1"].report.state is JobState.cancelled
    assert jobs["1"].report.allocations == []
    assert jobs["1"].report.end_time is not None
    assert jobs["4"].reason == "JobHeldUser"
    assert jobs["5"].report.queue == "high" and jobs["5"].report.gang_size == 3
    assert jobs["7"].user == "slurm" and jobs["7"].report.team == "slurm"
    assert jobs["9"].report.allocations == [AllocationReport(node="node1", gpu_indices=[0])]


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_jobs(version: str) -> None:
    jobs = recorded_jobs(version)
    training, gang, suspended, pending = jobs["4"], jobs["5"], jobs["6"], jobs["7"]

    # -A physics, --gres=gpu:h100:1, -J shaper:kind=training,sla=gold
    assert training.report.team == "physics" and training.account == "physics"
    assert training.report.allowed_gpu_models == ["h100"]
    assert (training.report.kind, training.report.sla_class) == (JobKind.training, "gold")
    assert training.report.allocations == [AllocationReport(node="node3", gpu_indices=[0])]
    assert training.user == "root"  # v0.0.36 leaves user_name empty: resolved from user_id

    # -N2 --gres=gpu:2 -p high --comment '… shaper:kind=batch_inference,priority=70,…'
    assert gang.report.gang_size == 2 and gang.report.gpus_requested == 4
    assert gang.report.queue == "high"
    assert gang.report.kind is JobKind.batch_inference
    assert gang.report.priority == 70 and gang.report.checkpointable is True
    assert [a.node for a in gang.report.allocations] == ["node1", "node2"]

    assert suspended.report.state is JobState.suspended
    assert suspended.report.allocations == [AllocationReport(node="node3", gpu_indices=[1])]

    assert pending.report.state is JobState.pending and pending.reason == "Resources"
    assert pending.report.gang_size == 3 and pending.report.gpus_requested == 6

    assert jobs["1"].restart_count == 1 and jobs["1"].report.state is JobState.cancelled


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 5400.0),  # minutes, as 22.05 prints them
        ({"set": True, "infinite": False, "number": 90}, 5400.0),  # later APIs
        ({"set": True, "infinite": True, "number": 0}, None),  # UNLIMITED
        ({"set": False, "number": 90}, None),
        (None, None),
        (0, None),
        (0xFFFFFFFE, None),  # NO_VAL
        (0xFFFFFFFF, None),  # INFINITE
        (True, None),
        ("90", None),
        (525_599, 525_599 * 60.0),
        (525_600, None),  # a year: backfill's stand-in for none
        ({"set": True, "infinite": False, "number": 525_600}, None),
    ],
)
def test_time_limits_are_read_in_seconds_and_none_means_none(
    value: object, seconds: float | None
) -> None:
    assert time_limit_s(value) == seconds


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_time_limits(version: str) -> None:
    """The recorded partitions have no limit: a job without --time reads null when the
    main scheduler started it (job 4) and a year when backfill did (job 8, behind job 7):
    none either way."""
    jobs = recorded_jobs(version)
    assert jobs["8"].report.time_limit_s is None
    assert jobs["4"].report.time_limit_s is None


def test_all_api_versions_and_the_cli_give_the_same_reports() -> None:
    reference_jobs = [job.report for job in recorded_jobs("v0.0.38").values()]
    reference_nodes = recorded_nodes("v0.0.38")
    for version in ("v0.0.36", "v0.0.37"):
        assert [job.report for job in recorded_jobs(version).values()] == reference_jobs
        assert recorded_nodes(version) == reference_nodes
    cli_jobs = parse_jobs(load(RECORDED / "squeue.json"), SlurmMapping())
    assert [job.report for job in cli_jobs] == reference_jobs
    assert parse_nodes(load(RECORDED / "sinfo.json"), SlurmMapping()) == reference_nodes


# --- mapping ---------------------------------------------------------------------------------


def test_mapping_rules_apply_in_order_and_job_tags_override_them() -> None:
    mapping = SlurmMapping(
        default_kind=JobKind.other,
        default_priority=10,
        rules=[
            MappingRule(partition="high", priority=90, sla_class="silver"),
            MappingRule(partition="high", account="physics", sla_class="platinum"),
            MappingRule(partition="debug", kind=JobKind.hpc),
            MappingRule(name_prefix="shaper:", kind=JobKind.quantization, priority=5),
        ],
    )
    jobs = recorded_jobs("v0.0.38", mapping)
    gang = jobs["5"].report  # partition high, no account; its comment sets priority=70
    assert (gang.kind, gang.priority, gang.sla_class) == (JobKind.batch_inference, 70, "silver")
    training = jobs["4"].report  # debug, named shaper:kind=training,sla=gold
    assert (training.kind, training.priority, training.sla_class) == (
        JobKind.training,
        5,
        "gold",
    )
    plain = jobs["6"].report
    assert (plain.kind, plain.priority, plain.sla_class) == (JobKind.hpc, 10, "standard")


def test_mapping_by_qos_and_without_job_tags() -> None:
    document = load(RECORDED / "rest-jobs-v0.0.38.json")
    for job in document["jobs"]:
        job["qos"] = "realtime" if job["job_id"] == 5 else "normal"
    mapping = SlurmMapping(
        honor_job_tags=False,
        team_from="user",
        rules=[MappingRule(qos="realtime", kind=JobKind.realtime_inference, priority=1000)],
    )
    jobs = {job.report.external_id: job.report for job in parse_jobs(document, mapping)}
    assert (jobs["5"].kind, jobs["5"].priority) == (JobKind.realtime_inference, 1000)
    assert jobs["5"].checkpointable is False  # the comment's tag is ignored
    assert (jobs["4"].kind, jobs["4"].sla_class, jobs["4"].team) == (
        JobKind.hpc,
        "standard",
        "root",
    )


def test_parse_tags() -> None:
    assert parse_tags("run42 shaper:kind=training,sla=gold extra") == {
        "kind": "training",
        "sla": "gold",
    }
    assert parse_tags("no tags here") == {}


def test_invalid_tags_are_ignored() -> None:
    document = load(RECORDED / "rest-jobs-v0.0.38.json")
    job = next(job for job in document["jobs"] if job["job_id"] == 6)
    job["comment"] = "shaper:kind=spaceship,priority=-3,priority=high,checkpointable=maybe"
    report = next(
        j.report for j in parse_jobs(document, SlurmMapping()) if j.report.external_id == "6"
    )
    assert (report.kind, report.priority, report.checkpointable) == (JobKind.hpc, 0, False)


def test_a_mapping_rule_needs_a_condition_and_an_effect() -> None:
    with pytest.raises(ValueError, match="at least one condition"):
        MappingRule(kind=JobKind.training)
    with pytest.raises(ValueError, match="must set"):
        MappingRule(qos="normal")


def test_unknown_job_state_is_reported_pending() -> None:
    document = load(SHARED / "squeue.json")
    document["jobs"][0]["job_state"] = "WARPING"
    assert parse_jobs(document, SlurmMapping())[0].report.state is JobState.pending


def test_a_pending_job_reports_the_nodes_it_is_pinned_to_and_a_running_one_none() -> None:
    document = load(SHARED / "squeue.json")
    pending = copy.deepcopy(document["jobs"][0])
    pending.update(job_id=901, job_state="PENDING", required_nodes="node[1-2]", nodes="")
    running = copy.deepcopy(document["jobs"][0])
    running.update(job_id=902, job_state="RUNNING", required_nodes="node1")
    document["jobs"] = [pending, running]

    jobs = {j.report.external_id: j.report for j in parse_jobs(document, SlurmMapping())}

    assert jobs["901"].required_nodes == ["node1", "node2"]
    assert jobs["902"].required_nodes == []  # where it runs is in its allocations


def test_a_pin_shaper_set_for_an_earlier_run_is_reported_lifted() -> None:
    """connectors.slurm.stamps: ``shaper-pin:<restarts>:<nodes before>:<nodes pinned>``."""
    document = load(SHARED / "squeue.json")
    base = copy.deepcopy(document["jobs"][0])
    base.update(job_state="PENDING", nodes="", required_nodes="node3", comment="")

    def job(job_id: int, **fields: Any) -> dict[str, Any]:
        return {**copy.deepcopy(base), "job_id": job_id, **fields}

    step = "shaper-step:a1:forward:requeue:0"
    document["jobs"] = [
        # Pinned for this run (requeued by Shaper, waiting for its start): a pin.
        job(911, restart_cnt=1, admin_comment=f"{step};shaper-pin:1::node3"),
        # Requeued since the run it was pinned for: its own list (none, or node[1-2]).
        job(912, restart_cnt=2, admin_comment=f"{step};shaper-pin:1::node3"),
        job(913, restart_cnt=1, admin_comment="shaper-pin:0:node[1-2]:node3"),
        # Submitted for a move, pinned by sbatch for its first run, and requeued since.
        job(914, restart_cnt=1, admin_comment="", comment="shaper-move:m-1"),
        job(915, restart_cnt=0, admin_comment="", comment="shaper-move:m-2"),
        # Someone else's words, or a pin stamp Shaper did not write: left as they are.
        job(916, restart_cnt=3, admin_comment="site-billing:x;shaper-pin:zz::"),
        # Its node list changed since Shaper's pin (an operator's edit): left as it is.
        job(917, restart_cnt=2, admin_comment="shaper-pin:1::node5"),
        # Requeued and held by Slurm (REQUEUE_HOLD): reported as Slurm has it until pending.
        job(918, restart_cnt=2, admin_comment="shaper-pin:1::node3", job_state="REQUEUE_HOLD"),
        # Running: where it runs is in its allocations, whatever its pin.
        job(919, restart_cnt=2, admin_comment="shaper-pin:1::node3", job_state="RUNNING"),
    ]
    jobs = {j.report.external_id: j for j in parse_jobs(document, SlurmMapping())}

    assert {job_id: j.report.required_nodes for job_id, j in jobs.items()} == {
        "911": ["node3"],
        "912": [],
        "913": ["node1", "node2"],
        "914": [],
        "915": ["node3"],
        "916": ["node3"],
        "917": ["node3"],
        "918": ["node3"],
        "919": [],
    }
    assert [job_id for job_id, j in jobs.items() if j.stale_pin] == ["912", "913", "914"]
    assert jobs["913"].admin_comment == "shaper-pin:0:node[1-2]:node3"
    assert jobs["913"].required_nodes == "node3" and jobs["914"].moved


def test_stamps_share_the_admin_comment_with_the_words_of_others() -> None:
    comment = "site:x;shaper-step:a1:forward:requeue:0"
    pin = Pin(restarts=1, before="node[1-2]", pinned="node3")
    pinned = with_stamp(comment, PIN, pin.word)
    assert pinned == "site:x;shaper-step:a1:forward:requeue:0;shaper-pin:1:node[1-2]:node3"
    assert read_pin(pinned) == pin
    assert pin.stale(restarts=2, required_nodes="node3")
    assert not pin.stale(restarts=1, required_nodes="node3")
    assert not pin.stale(restarts=2, required_nodes="node[3-4]")
    assert Pin(restarts=0, before="", pinned="node[1-2]").stale(
        restarts=1, required_nodes="node2,node1"
    )
    stepped = with_stamp(pinned, STEP, "shaper-step:a2:forward:requeue:1")
    assert stepped == "site:x;shaper-step:a2:forward:requeue:1;shaper-pin:1:node[1-2]:node3"
    assert with_stamp(stepped, PIN, None) == "site:x;shaper-step:a2:forward:requeue:1"
    assert stamp(stepped, STEP) == "shaper-step:a2:forward:requeue:1"
    assert stamp("", PIN) is None and read_pin("") is None


@pytest.mark.parametrize("version", VERSIONS)
def test_pending_and_running_jobs_carry_submit_options_and_others_none(version: str) -> None:
    jobs = recorded_jobs(version)
    # Job 5 runs (a checkpointable 2-node gang): a move checkpoints it and submits it again.
    gang = jobs["5"]
    assert gang.report.state is JobState.running
    assert gang.submit_options == {
        "job-name": "wrap",
        "comment": "run42 shaper:kind=batch_inference,priority=70,checkpointable=true",
        "chdir": "/tmp/sl1/jobs",
        "partition": "high",
        "nodes": "2",
        "ntasks": "2",
        "mem-per-cpu": "500M",
        "gres": "gpu:2",
        "requeue": True,
    }
    assert jobs["4"].submit_options is not None and jobs["4"].submit_options["account"] == (
        "physics"
    )
    assert jobs["7"].report.state is JobState.pending and jobs["7"].submit_options is not None
    assert jobs["6"].report.state is JobState.suspended and jobs["6"].submit_options is None
    assert jobs["1"].report.state is JobState.cancelled and jobs["1"].submit_options is None


def test_a_running_job_that_is_ending_or_cannot_move_carries_no_submit_options() -> None:
    document = load(RECORDED / "rest-jobs-v0.0.38.json")
    running = next(job for job in document["jobs"] if job["job_id"] == 5)
    completing = {**copy.deepcopy(running), "job_id": 905, "job_state": "COMPLETING"}
    array = {**copy.deepcopy(running), "job_id": 906, "array_job_id": 906}
    interactive = {**copy.deepcopy(running), "job_id": 907, "batch_flag": False}
    configuring = {**copy.deepcopy(running), "job_id": 908, "job_state": "CONFIGURING"}
    document["jobs"] = [completing, array, interactive, configuring]

    jobs = {j.report.external_id: j for j in parse_jobs(document, SlurmMapping())}

    assert jobs["905"].report.state is JobState.running  # it still holds its nodes
    assert jobs["905"].submit_options is None  # but it has nothing left to move
    assert jobs["906"].submit_options is None and jobs["907"].submit_options is None
    assert jobs["908"].submit_options is not None  # starting: it runs


def test_reservations_are_read_from_scontrol_and_only_shapers_are_claimed() -> None:
    output = (
        "ReservationName=shaper-42 StartTime=2026-12-03T07:11:23 EndTime=2026-12-03T07:21:23 "
        "Duration=00:10:00 Nodes=node[1-2] NodeCnt=2 CoreCnt=8 Features=(null) "
        "PartitionName=(null) Flags=FLEX,OVERLAP,IGNORE_JOBS,SPEC_NODES TRES=cpu=8 Users=root "
        "Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null)\n"
    )
    (reservation,) = parse_reservations(output)
    assert reservation == SlurmReservation(
        name="shaper-42", nodes=("node1", "node2"), users=("root",), state="ACTIVE"
    )
    assert parse_reservations("No reservations in the system\n") == []
    assert job_of("shaper-", "shaper-42") == "42"
    assert job_of("shaper-", "shaper-7_3") == "7_3"
    assert job_of("shaper-", "shaper-maint") is None  # an administrator's
    assert job_of("shaper-", "maint") is None
    assert duration_minutes(60) == 1 and duration_minutes(61) == 2 and duration_minutes(1) == 1


def test_elastic_training_jobs_report_their_node_range() -> None:
    """Recorded (data/README.md): job 2 runs on 2 nodes, tagged ``nodes=1-3``; job 3 waits,
    held, submitted with ``--nodes=1-3``; job 1 ran from such a range on 3 nodes (ended)."""
    document = load(RECORDED / "squeue-elastic.json")
    jobs = {j.report.external_id: j.report for j in parse_jobs(document, SlurmMapping())}
    ranges = {
        job_id: (r.state.value, r.gang_size, r.gpus_requested, r.min_replicas, r.max_replicas)
        for job_id, r in jobs.items()
    }
    assert ranges == {
        "1": ("cancelled", 3, 6, 0, 0),  # Slurm no longer says it had a range
        "2": ("running", 2, 4, 1, 3),
        "3": ("pending", 1, 2, 1, 3),
    }
    assert jobs["2"].replicas == jobs["3"].replicas == 3  # it asks for the most
    assert jobs["2"].checkpointable and jobs["2"].kind is JobKind.training
    # GPUs asked per task or per job do not grow with the nodes: no range.
    per_task = copy.deepcopy(document)
    for row in per_task["jobs"]:
        row["tres_per_node"], row["tres_per_task"] = "", "gres:gpu:1"
    assert {j.report.max_replicas for j in parse_jobs(per_task, SlurmMapping())} == {0}
    # Without job tags only Slurm's own range counts.
    untagged = {
        j.report.external_id: j.report
        for j in parse_jobs(document, SlurmMapping(honor_job_tags=False))
    }
    assert (untagged["2"].max_replicas, untagged["3"].max_replicas) == (0, 3)


@pytest.mark.parametrize(
    ("tag", "expected"), [("2-2", (0, 0)), ("3-1", (0, 0)), ("x", (0, 0)), ("2-4", (2, 4))]
)
def test_a_node_range_tag_must_be_a_range(tag: str, expected: tuple[int, int]) -> None:
    document = load(RECORDED / "squeue-elastic.json")
    running = next(j for j in document["jobs"] if j["job_id"] == 2)
    running["comment"] = f"shaper:kind=training,nodes={tag}"
    document["jobs"] = [running]
    (report,) = [j.report for j in parse_jobs(document, SlurmMapping())]
    assert (report.min_replicas, report.max_replicas) == expected
