"""Parsing Slurm 24.11's JSON (data_parser v0.0.40-v0.0.42; recorded outputs, see
data/README.md) into Shaper's types, through connectors.slurm.versions."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from connectors.base import ConnectorError
from connectors.slurm import SlurmConnector, SlurmConnectorConfig
from connectors.slurm.config import SlurmMapping
from connectors.slurm.parse import LABEL_REASON, api_version, parse_jobs, parse_nodes
from connectors.slurm.versions import legacy_job, legacy_job_state, legacy_node
from wire.telemetry import AllocationReport, JobKind, JobState, NodeState

RECORDED = Path(__file__).parent / "data" / "slurm-24.11-recorded"
REST_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
# squeue --json --states=all and scontrol show nodes --json (the CLI's, v0.0.42), and
# slurmrestd's GET jobs / GET nodes at each version, all taken at one moment.
JOB_RECORDINGS = ("squeue.json", *(f"rest-jobs-{v}.json" for v in REST_VERSIONS))
NODE_RECORDINGS = ("scontrol-nodes.json", *(f"rest-nodes-{v}.json" for v in REST_VERSIONS))


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return document


@pytest.mark.parametrize("name", [*JOB_RECORDINGS, *NODE_RECORDINGS, "scontrol-job-4.json"])
def test_the_version_is_read_from_the_data_parser(name: str) -> None:
    expected = name.removesuffix(".json").rsplit("-", 1)[-1] if "rest" in name else "v0.0.42"
    assert api_version(load(name), what=name) == expected


def test_every_version_and_the_cli_give_the_same_reports() -> None:
    mapping = SlurmMapping()
    jobs = [[job.report for job in parse_jobs(load(name), mapping)] for name in JOB_RECORDINGS]
    nodes = [parse_nodes(load(name), mapping) for name in NODE_RECORDINGS]
    assert all(reports == jobs[0] for reports in jobs[1:])
    assert all(reports == nodes[0] for reports in nodes[1:])
    # scontrol show job 4 --json: the job as the whole queue's read has it.
    (alone,) = parse_jobs(load("scontrol-job-4.json"), mapping)
    assert alone.report == next(r for r in jobs[0] if r.external_id == "4")


def test_nodes() -> None:
    nodes = {n.name: n for n in parse_nodes(load("scontrol-nodes.json"), SlurmMapping())}
    assert [n.state for n in nodes.values()] == [
        NodeState.up,
        NodeState.up,
        NodeState.draining,
    ]
    assert nodes["node3"].labels[LABEL_REASON] == "maint-window"
    assert (nodes["node1"].gpu_model, nodes["node1"].gpu_count) == ("h100", 2)
    assert (nodes["node1"].cpu_cores, nodes["node1"].memory_mib) == (4, 4000)


def test_jobs() -> None:
    """What was submitted (data/README.md) is what is reported."""
    jobs = {j.report.external_id: j for j in parse_jobs(load("squeue.json"), SlurmMapping())}
    states = {job_id: job.report.state for job_id, job in jobs.items()}
    assert states == {
        "1": JobState.finished,
        "2": JobState.cancelled,
        "3": JobState.running,
        "4": JobState.running,
        "5": JobState.suspended,
        "6": JobState.pending,
        "7": JobState.pending,
        "8": JobState.running,
    }
    assert jobs["2"].report.restart_count == 1
    tagged = jobs["3"].report
    assert (tagged.kind, tagged.sla_class, tagged.team) == (JobKind.training, "gold", "physics")
    assert tagged.allocations == [AllocationReport(node="node3", gpu_indices=[0])]
    # Started by the backfill, which wrote a year into its empty limit: no limit.
    assert tagged.time_limit_s is None
    assert jobs["3"].submit_options is not None
    gang = jobs["4"].report
    assert (gang.kind, gang.priority, gang.checkpointable) == (JobKind.batch_inference, 70, True)
    assert (gang.gang_size, gang.gpus_requested, gang.queue) == (2, 2, "high")
    assert [a.node for a in gang.allocations] == ["node1", "node2"]
    assert jobs["5"].report.allocations == [AllocationReport(node="node3", gpu_indices=[1])]
    waiting = jobs["6"].report
    assert (waiting.reason, waiting.gang_size, waiting.gpus_requested) == ("Resources", 3, 6)
    assert waiting.time_limit_s is None  # unlimited: {"set": false, "infinite": true}
    held = jobs["7"]
    assert held.held and held.report.reason == "JobHeldUser"
    assert (held.report.min_replicas, held.report.max_replicas) == (1, 3)  # --nodes=1-3
    assert jobs["8"].report.gpus_requested == 0


def test_a_pending_jobs_submit_options_come_from_its_record() -> None:
    jobs = {j.report.external_id: j for j in parse_jobs(load("squeue.json"), SlurmMapping())}
    options = jobs["6"].submit_options
    assert options is not None
    assert (options["nodes"], options["gres"], options["partition"]) == ("3", "gpu:h100:2", "debug")
    # Job 3 was started by the backfill, which writes a year into a job's empty limit: no
    # --time goes with it (a target partition with a shorter MaxTime would refuse it).
    assert jobs["3"].submit_options is not None and "time" not in jobs["3"].submit_options


@pytest.mark.parametrize(
    ("states", "word", "state"),
    [
        (["PENDING"], "PENDING", JobState.pending),
        (["PENDING", "REQUEUED"], "REQUEUED", JobState.pending),
        (["PENDING", "REQUEUE_HOLD"], "REQUEUE_HOLD", JobState.pending),
        (["RUNNING", "COMPLETING"], "COMPLETING", JobState.running),
        (["COMPLETED", "COMPLETING"], "COMPLETING", JobState.running),  # still holds its nodes
        (["RUNNING", "CONFIGURING"], "CONFIGURING", JobState.running),
        (["CANCELLED"], "CANCELLED", JobState.cancelled),
        (["FAILED", "LAUNCH_FAILED"], "FAILED", JobState.failed),  # no word of 22.05's
    ],
)
def test_a_state_list_is_read_as_the_one_word_slurm_22_printed(
    states: list[str], word: str, state: JobState
) -> None:
    assert legacy_job_state(states) == word
    document = load("squeue.json")
    record = copy.deepcopy(next(j for j in document["jobs"] if j["job_id"] == 6))
    record["job_state"] = states
    (job,) = parse_jobs({**document, "jobs": [record]}, SlurmMapping())
    assert job.report.state is state
    assert legacy_job(record)["job_state"] == word


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["IDLE"], NodeState.up),
        (["MIXED", "DRAIN"], NodeState.draining),
        (["IDLE", "DRAIN"], NodeState.draining),  # drained
        (["IDLE", "NOT_RESPONDING"], NodeState.down),
        (["DOWN"], NodeState.down),
        (["IDLE", "POWERED_DOWN"], NodeState.down),
        (["ALLOCATED", "MAINTENANCE"], NodeState.draining),
    ],
)
def test_a_node_state_list_is_read_as_base_and_flags(
    states: list[str], expected: NodeState
) -> None:
    document = load("scontrol-nodes.json")
    record = copy.deepcopy(document["nodes"][0])
    record["state"] = states
    (node,) = parse_nodes({**document, "nodes": [record]}, SlurmMapping())
    assert node.state is expected
    legacy = legacy_node(record)
    assert legacy["state"] == states[0].lower() and legacy["state_flags"] == states[1:]


def test_numbers_unset_and_infinite() -> None:
    record = legacy_job(
        {
            "job_id": 9,
            "job_state": ["PENDING"],
            "node_count": {"set": True, "infinite": False, "number": 2},
            "max_nodes": {"set": False, "infinite": False, "number": 0},
            "time_limit": {"set": False, "infinite": True, "number": 0},
        }
    )
    assert (record["node_count"], record["max_nodes"]) == (2, None)
    assert record["time_limit"] == 0xFFFFFFFF  # INFINITE, as 22.05 printed it


# --- the connector's CLI reads on Slurm 24.11, over its recorded answers --------------------


class RecordedCli:
    """A ``run`` for SlurmConnector that answers Slurm 24.11's CLI from the recordings, and
    keeps the commands it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        args = command[1:]
        self.asked.append(args)
        answers = {
            ("--json", "--states=all"): "squeue.json",
            ("show", "nodes", "--json"): "scontrol-nodes.json",
            ("show", "job", "4", "--json"): "scontrol-job-4.json",
        }
        if tuple(args) == ("--json",):  # sinfo --json: 23.02+ group nodes under "sinfo"
            meta = load("squeue.json")["meta"]
            return subprocess.CompletedProcess(command, 0, json.dumps({"sinfo": [], "meta": meta}))
        if tuple(args[:2]) == ("show", "job"):  # scontrol answers an unknown job with no job
            name = answers.get(tuple(args))
            document = load(name) if name else {**load("scontrol-job-4.json"), "jobs": []}
            return subprocess.CompletedProcess(command, 0, json.dumps(document))
        return subprocess.CompletedProcess(
            command, 0, (RECORDED / answers[tuple(args)]).read_text()
        )


def test_the_cli_reads_nodes_with_scontrol_and_one_job_alone_once_it_knows_the_version() -> None:
    cli = RecordedCli()
    connector = SlurmConnector(SlurmConnectorConfig(cluster="c", submit_specs=False), run=cli)
    # An actions-only connector has read nothing: its first step reads the queue, which
    # tells the version; later steps read their job alone.
    assert connector._job("4", what="step").report.gang_size == 2
    assert connector._job("4", what="step").report.state is JobState.running
    assert cli.asked == [["--json", "--states=all"], ["show", "job", "4", "--json"]]

    cli.asked.clear()
    state = connector.read_state()
    assert [n.state for n in state.nodes] == [NodeState.up, NodeState.up, NodeState.draining]
    assert cli.asked == [["show", "nodes", "--json"], ["--json", "--states=all"]]

    fresh = RecordedCli()
    SlurmConnector(SlurmConnectorConfig(cluster="c"), run=fresh).read_nodes()
    assert fresh.asked == [["--json"], ["show", "nodes", "--json"]]  # sinfo, then scontrol

    cli.asked.clear()
    with pytest.raises(ConnectorError, match="Slurm has no job 999") as gone:
        connector._job("999", what="step")
    assert not gone.value.retryable
    assert cli.asked == [["show", "job", "999", "--json"], ["--json", "--states=all"]]
