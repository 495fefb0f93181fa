"""Federated moves between two real Slurm clusters (issue 16), with nothing simulated.

Cluster A is the session's test cluster (scripts/slurm-cluster.sh: node1-3, partition
`debug`), cluster B a second one beside it (tests/support/second_slurm_cluster.py: bnode1-2,
partition `batch`, its own slurmctld). A job waits in a full A; A's connector reports how
to submit it again (its batch script and options); B's action executor submits it with a
real `submit` step, and it runs there with the same script; a resent step submits nothing;
then A's executor cancels A's copy. A spec B cannot run is refused for good, saying why.
A running job's move: B submits it held and pinned to one node, and it starts there only
once released. The first tests read Slurm's recorded JSON and need no cluster.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.slurm import SlurmConnector
from connectors.slurm.submission import (
    SWITCHED_OFF,
    TargetCluster,
    live_moved_jobs,
    move_comment,
    moved_job,
    not_movable,
    ran_moved_jobs,
    sbatch_request,
    submit_options,
    switch_off_source_directives,
)
from tests.connectors.conftest import SecondSlurmCluster, SlurmCluster
from wire.steps import Outcome, StepRequest
from wire.telemetry import (
    MAX_SUBMIT_SPEC,
    JobKind,
    JobState,
    PortableSpec,
    SchedulerKind,
    SubmitSpec,
)

SHARED = Path(__file__).parent / "data" / "slurm-22.05-shared"
TARGET = TargetCluster(
    name="hpc-b", partitions=("batch", "gpu"), default_partition="batch", portable_workdir="/tmp"
)


def _no_home(user: str) -> str | None:
    return None


# --- a job's record → options, and a spec → sbatch (recorded JSON, no cluster) ----------------


def test_the_options_of_a_pending_job_come_from_its_record() -> None:
    jobs = json.loads((SHARED / "squeue.json").read_text())["jobs"]
    pending = next(job for job in jobs if job["job_state"] == "PENDING")
    assert not_movable(pending) is None
    assert submit_options(pending) == {
        "job-name": "sleep.sh",
        "chdir": "/srv/jobs/jobs",
        "output": "/srv/jobs/jobs/%j.out",
        "partition": "debug",
        "nodes": "1",
        "ntasks": "1",
        "gpus": "1",  # tres_per_job "gres:gpu:1": --gpus=1
        "requeue": True,
    }
    assert not_movable({**pending, "array_job_id": 12}) == "an array job"
    assert not_movable({**pending, "dependency": "afterok:2"}) == (
        "it depends on jobs of its own cluster"
    )
    assert not_movable({**pending, "batch_flag": False}) == (
        "it has no batch script (salloc or srun)"
    )


def test_directives_that_name_the_source_cluster_are_switched_off_and_no_others() -> None:
    script = (
        "#!/bin/bash\n#SBATCH --nodelist=node1\n#SBATCH -w node2\n#SBATCH --gres=gpu:1\n"
        "#SBATCH --dependency=afterok:3\n\necho go\n#SBATCH --reservation=late\n"
    )
    lines = switch_off_source_directives(script).splitlines()
    assert lines[1] == f"{SWITCHED_OFF} --nodelist=node1"
    assert lines[2] == f"{SWITCHED_OFF} -w node2"
    assert lines[3] == "#SBATCH --gres=gpu:1"
    assert lines[4] == f"{SWITCHED_OFF} --dependency=afterok:3"
    # After the first command sbatch reads no directive: that line is the script's business.
    assert lines[7] == "#SBATCH --reservation=late"


def test_a_spec_gets_the_targets_partition_and_the_moves_mark() -> None:
    spec = SubmitSpec(
        scheduler=SchedulerKind.slurm,
        native={
            "script": "#!/bin/sh\necho hi\n",
            "options": {"partition": "debug,gpu", "comment": "shaper:kind=training", "nodes": 1},
            "user": "root",
        },
    )
    request = sbatch_request(spec, name="mv-1", target=TARGET, home_of=_no_home)
    assert "--partition=gpu" in request.args  # debug is not on hpc-b; gpu is
    assert "--comment=shaper:kind=training shaper-move:mv-1" in request.args
    assert "--nodes=1" in request.args
    assert request.user == "root" and request.env["USER"] == "root"

    elsewhere = spec.model_copy(update={"native": {**spec.native, "options": {"partition": "x"}}})
    request = sbatch_request(elsewhere, name="mv-1", target=TARGET, home_of=_no_home)
    assert "--partition=batch" in request.args  # the target's default, named explicitly


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (
            SubmitSpec(scheduler=SchedulerKind.kubernetes, native={"job": {}}),
            "a kubernetes job cannot run on Slurm cluster hpc-b: its spec has no portable form",
        ),
        (
            SubmitSpec(
                scheduler=SchedulerKind.ray,
                portable=PortableSpec(image="trainer:2", command=["python", "t.py"]),
            ),
            "needs the container image 'trainer:2', and this Slurm connector runs no containers",
        ),
        (
            SubmitSpec(scheduler=SchedulerKind.ray, portable=PortableSpec(gpus=1)),
            "the portable form has no command",
        ),
        (
            SubmitSpec(
                scheduler=SchedulerKind.slurm,
                native={"script": "#!/bin/sh\n", "options": {"uid": "0"}},
            ),
            "native.options ['uid'] are not options a moved job may carry",
        ),
        (
            SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "echo no shebang"}),
            "native.script must be a batch script starting with '#!'",
        ),
        (
            SubmitSpec(
                scheduler=SchedulerKind.slurm,
                native={"script": "#!/bin/sh\n", "options": {"chdir": "/tmp\n#SBATCH -w x"}},
            ),
            "native.options.chdir must be one non-empty line",
        ),
    ],
)
def test_a_spec_slurm_cannot_run_is_refused_for_good(spec: SubmitSpec, why: str) -> None:
    with pytest.raises(ConnectorError) as refused:
        sbatch_request(spec, name="mv-2", target=TARGET, home_of=_no_home)
    assert not refused.value.retryable
    assert why in str(refused.value)


def test_a_job_moved_twice_carries_only_its_last_moves_mark() -> None:
    assert move_comment("shaper:kind=hpc shaper-move:mv-1", "mv-2") == (
        "shaper:kind=hpc shaper-move:mv-2"
    )
    listed = "7|shaper:kind=hpc shaper-move:mv-2\n8|shaper-move:mv-20\n9|\n"
    assert moved_job(listed, "mv-2") == "7"
    assert moved_job(listed, "mv-3") is None


def test_a_withdraw_finds_only_the_moves_jobs_that_have_not_ended() -> None:
    # squeue -o connectors.slurm.arrival.LISTED_FORMAT: id|state|start|end|nodes|reason|comment
    t0, t1 = "2026-12-04T10:00:00", "2026-12-04T10:05:00"
    listed = (
        f"7|CANCELLED|{t0}|{t0}||Priority|shaper-move:mv-2\n"
        f"12|RUNNING|{t0}|{t1}|node1|None|shaper-move:mv-2\n"
        "8|PENDING|N/A|N/A||Priority|a|b shaper-move:mv-2\n"
        f"9|RUNNING|{t0}|{t1}|node1|None|shaper-move:mv-20\n"
        f"10|COMPLETING|{t0}|{t1}|node2|None|shaper-move:mv-2\n"
        f"11|RUNNING|{t0}|{t1}|node3|None|shaper:kind=hpc\n"
    )
    assert live_moved_jobs(listed, "mv-2") == ["8", "12"]  # oldest first
    assert live_moved_jobs(listed, "mv-3") == []
    ran = listed + (
        f"13|COMPLETED|{t0}|{t1}|node1|None|shaper-move:mv-2\n"
        f"14|FAILED|{t0}|{t0}|node1|NonZeroExitCode|shaper-move:mv-2\n"
    )
    assert ran_moved_jobs(ran, "mv-2") == [("13", "COMPLETED"), ("14", "FAILED")]
    assert ran_moved_jobs(listed, "mv-2") == []  # cancelled, or still ending: not "ran"


def test_a_pinned_held_submit_names_only_the_targets_nodes_and_is_held() -> None:
    script = "#!/bin/bash\n#SBATCH --nodelist=node1\n#SBATCH --exclude=bnode2\nsleep 1\n"
    spec = SubmitSpec(
        scheduler=SchedulerKind.slurm,
        native={"script": script, "options": {"partition": "batch", "nodes": "1"}},
    )
    request = sbatch_request(
        spec, name="mv-7", target=TARGET, home_of=_no_home, nodes=["bnode2"], hold=True
    )
    # The pin is the only node list sbatch sees: the source's lines are switched off.
    assert [a for a in request.args if a.startswith(("--nodelist", "--exclude"))] == [
        "--nodelist=bnode2"
    ]
    assert "--hold" in request.args
    assert f"{SWITCHED_OFF} --nodelist=node1" in request.script
    assert f"{SWITCHED_OFF} --exclude=bnode2" in request.script
    plain = sbatch_request(spec, name="mv-7", target=TARGET, home_of=_no_home, nodes=[])
    assert not [a for a in plain.args if a.startswith(("--nodelist", "--hold"))]
    # A spec cannot name nodes itself; and a pin is node names, not options.
    smuggled = spec.model_copy(
        update={"native": {**spec.native, "options": {"nodelist": "bnode1"}}}
    )
    with pytest.raises(ConnectorError, match=r"\['nodelist'\] are not options"):
        sbatch_request(smuggled, name="mv-7", target=TARGET, home_of=_no_home)
    with pytest.raises(ConnectorError, match="cannot pin the job to") as refused:
        sbatch_request(spec, name="mv-7", target=TARGET, home_of=_no_home, nodes=["bnode1 --uid=0"])
    assert not refused.value.retryable


def test_a_move_name_must_be_one_word() -> None:
    spec = SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\n"})
    with pytest.raises(ConnectorError, match="the move name 'a b' must be"):
        sbatch_request(spec, name="a b", target=TARGET, home_of=_no_home)


# --- two real clusters ---------------------------------------------------------------------------

_keys = itertools.count(1)


def _step(step: str, workload_id: str, *, key: str = "", **args: Any) -> StepRequest:
    return StepRequest(
        action_id=16,
        key=key or f"a16:forward:{step}:{next(_keys)}",
        step=step,
        workload_id=workload_id,
        generation=2,
        args=args,
    )


PROOF_SCRIPT = """#!/bin/bash
#SBATCH --job-name=federated-proof
#SBATCH --nodelist=node1
#SBATCH --comment=shaper:kind=training
{{
  echo "cluster=$SLURM_CLUSTER_NAME job=$SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES"
  echo "user=$(id -un) secret=${{SHAPER_TEST_CONNECTOR_SECRET:-none}}"
}} > {proof}
"""
# The unprivileged user scripts/slurm-cluster.sh creates for slurmrestd: the moved job is
# this user's, and must run as this user on the other cluster too.
JOB_USER = os.environ.get("SHAPER_SLURM_REST_USER", "shaper-rest")


@pytest.fixture
def user_jobs_cancelled(slurm: SlurmCluster, slurm_b: SecondSlurmCluster) -> Iterator[None]:
    """The clusters' own cleanup cancels root's jobs; this test's job is JOB_USER's."""
    yield
    for cluster in (slurm, slurm_b):
        cluster.run("scancel", f"--user={JOB_USER}")


def _recording_run(commands: list[list[str]]) -> Any:
    """subprocess.run that also notes the Slurm commands the connector runs."""

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.run(command, **kwargs)

    return run


def test_a_job_pending_on_a_full_cluster_runs_on_the_other_and_leaves_the_first(
    slurm: SlurmCluster,
    slurm_b: SecondSlurmCluster,
    user_jobs_cancelled: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The connectors' own environment holds secrets; a moved job must not inherit it.
    monkeypatch.setenv("SHAPER_TEST_CONNECTOR_SECRET", "hunter2")
    filler = slurm.sbatch("-N3", "--gres=gpu:2")
    slurm.wait_state(filler, "RUNNING")
    workdir = slurm.jobs_dir / f"moved-{tmp_path.name}"
    workdir.mkdir()
    workdir.chmod(0o777)  # the job's user writes there
    proof = workdir / "proof.txt"
    script = workdir / "proof.sh"
    script.write_text(PROOF_SCRIPT.format(proof=proof))
    waiting = slurm.run(
        "sbatch",
        "--parsable",
        f"--uid={JOB_USER}",
        f"--chdir={workdir}",
        f"--output={workdir}/%j.out",
        "--gres=gpu:1",
        "--time=10",
        str(script),
    ).strip()
    big = slurm.run(
        "sbatch",
        "--parsable",
        f"--chdir={slurm.jobs_dir}",
        "--gres=gpu:1",
        "--wrap",
        "true # " + "x" * MAX_SUBMIT_SPEC,
    ).strip()
    slurm.wait_for("the job to wait for GPUs", lambda: slurm.job(waiting)["state"] == "PENDING")

    # A's telemetry: the pending job carries its script and options, read once.
    commands: list[list[str]] = []
    reader = SlurmConnector(slurm.config(), run=_recording_run(commands))
    slurm.connectors.append(reader)
    reader.read_state()
    jobs = {job.external_id: job for job in reader.read_state().jobs}  # from the cache
    scripts_read = [c for c in commands if c[1:3] == ["write", "batch_script"]]
    assert sorted(c[3] for c in scripts_read) == sorted([waiting, big, filler])  # once each
    # A running job carries its spec too (a checkpointable one's move restores it there).
    assert jobs[filler].state is JobState.running and jobs[filler].submit is not None
    assert jobs[big].submit is None  # its script is longer than the wire takes
    spec = jobs[waiting].submit
    assert spec is not None and spec.scheduler is SchedulerKind.slurm
    assert spec.native["script"] == script.read_text()
    options = spec.native["options"]
    assert options["gres"] == "gpu:1" and options["time"] == "10"
    assert options["partition"] == "debug" and options["job-name"] == "federated-proof"
    assert spec.native["workdir"] == str(workdir) and spec.native["user"] == JOB_USER
    # A long queue costs at most submit_scripts_per_read scontrol calls per read.
    commands.clear()
    frugal = SlurmConnector(slurm.config(submit_scripts_per_read=1), run=_recording_run(commands))
    slurm.connectors.append(frugal)
    for _ in range(4):
        reads_before = len(commands)
        frugal.read_state()
        assert len([c for c in commands[reads_before:] if c[1:2] == ["write"]]) <= 1
    writes = [c[3] for c in commands if c[1:2] == ["write"]]
    assert len(writes) == 3 and writes[-1] == filler  # pending jobs' scripts first

    # B submits it, through its executor, with a real submit step.
    on_b = ConnectorStepExecutor(
        slurm_b.connector(), cluster="hpc-b", state_dir=tmp_path / "connector-b"
    )
    name = f"mv-hpc-test-{waiting}"
    submit = _step(
        "submit", waiting, spec=spec.model_dump(mode="json"), name=name, source_cluster="hpc-test"
    )
    report = on_b.run(submit)
    assert report.ok and report.outcome is Outcome.executed, report.error
    moved = report.result["external_id"]
    slurm_b.wait_state(moved, "COMPLETED")
    assert proof.read_text().splitlines() == [
        f"cluster=shaper-b job={moved} gpus=0",
        f"user={JOB_USER} secret=none",
    ]
    row = slurm_b.job(moved)
    assert row["partition"] == "batch"  # A's "debug" does not exist on B
    b_report = next(j for j in slurm_b.connector().read_state().jobs if j.external_id == moved)
    assert b_report.name == "federated-proof" and b_report.kind is JobKind.training

    # The answer was lost and the step comes again: answered from the journal.
    again = on_b.run(submit)
    assert again.outcome is Outcome.duplicate and again.result == report.result
    # A new delivery (another key, same move): the job submitted before, nothing new.
    redelivered = on_b.run(_step("submit", waiting, spec=spec.model_dump(mode="json"), name=name))
    assert redelivered.ok and redelivered.result["external_id"] == moved
    marked = slurm_b.run("squeue", "-h", "-t", "all", "-o", "%i %k").splitlines()
    assert [line.split()[0] for line in marked if f"shaper-move:{name}" in line] == [moved]
    # A move whose job already ran here cannot be undone: withdrawing it is refused for good,
    # so the saga never releases the source's copy to run the job a second time.
    ended = on_b.run(_step("withdraw", waiting, name=name, source_cluster="hpc-test"))
    assert not ended.ok and ended.outcome is Outcome.executed
    assert f"job {moved} of this move already ran here and ended COMPLETED" in (ended.error or "")

    # Only after B has it does A let go of its copy.
    on_a = ConnectorStepExecutor(slurm.connector(), cluster="hpc-test", state_dir=tmp_path / "a")
    cancelled = on_a.run(_step("cancel", waiting))
    assert cancelled.ok, cancelled.error
    slurm.wait_state(waiting, "CANCELLED")
    assert slurm.job(filler)["state"] == "RUNNING"

    # A spec B cannot run: refused for good, with Slurm's reason, journalled.
    too_big = spec.model_copy(
        update={"native": {**spec.native, "options": {**options, "gres": "gpu:8"}}}
    )
    refused = on_b.run(
        _step("submit", waiting, spec=too_big.model_dump(mode="json"), name=f"{name}-big")
    )
    assert not refused.ok and not refused.retryable
    assert "Requested node configuration is not available" in (refused.error or "")
    foreign = SubmitSpec(scheduler=SchedulerKind.kubernetes, native={"job": {}})
    refused = on_b.run(
        _step("submit", "ns/train", spec=foreign.model_dump(mode="json"), name="mv-k8s-1")
    )
    assert not refused.ok and not refused.retryable
    assert "its spec has no portable form" in (refused.error or "")


def test_a_portable_spec_runs_on_slurm_as_a_command_with_its_resources(
    slurm_b: SecondSlurmCluster, user_jobs_cancelled: None, tmp_path: Path
) -> None:
    workdir = Path(slurm_b.directory) / f"portable-{tmp_path.name}"
    workdir.mkdir()
    workdir.chmod(0o777)  # the job's user writes there
    out = workdir / "out.txt"
    spec = SubmitSpec(
        scheduler=SchedulerKind.ray,
        native={"entrypoint": "python train.py"},
        portable=PortableSpec(
            command=["sh", "-c", f'echo "$(id -un): $GREETING $CUDA_VISIBLE_DEVICES" > {out}'],
            env={"GREETING": "hello from ray"},
            gpus=2,
            cpus=1.5,
            memory_mib=256,
        ),
    )
    as_root = ConnectorStepExecutor(slurm_b.connector(), cluster="hpc-b", state_dir=tmp_path / "r")
    refused = as_root.run(
        _step("submit", "raysubmit_1", spec=spec.model_dump(mode="json"), name="mv-r1")
    )
    assert not refused.ok and not refused.retryable
    assert "names no user to run as, and this connector runs as root" in (refused.error or "")

    connector = slurm_b.connector(portable_workdir=workdir, portable_user=JOB_USER)
    on_b = ConnectorStepExecutor(connector, cluster="hpc-b", state_dir=tmp_path)
    report = on_b.run(
        _step("submit", "raysubmit_1", spec=spec.model_dump(mode="json"), name="mv-r1")
    )
    assert report.ok, report.error
    slurm_b.wait_state(report.result["external_id"], "COMPLETED")
    assert out.read_text().strip() == f"{JOB_USER}: hello from ray 0,1"
    assert slurm_b.job(report.result["external_id"])["tres-per-node"] == "gres:gpu:2"

    # A move undone while its job runs: withdraw cancels it, once.
    sleeper = spec.model_copy(
        update={"portable": PortableSpec(command=["sleep", "600"], gpus=1, memory_mib=64)}
    )
    running = on_b.run(
        _step("submit", "raysubmit_2", spec=sleeper.model_dump(mode="json"), name="mv-r2")
    )
    assert running.ok, running.error
    job_id = running.result["external_id"]
    slurm_b.wait_state(job_id, "RUNNING")
    withdrawn = on_b.run(_step("withdraw", "raysubmit_2", name="mv-r2"))
    assert withdrawn.ok and withdrawn.result["external_id"] == job_id, withdrawn.error
    slurm_b.wait_state(job_id, "CANCELLED")
    assert connector.withdraw("mv-r2") == job_id  # a resend answers as the first did
    assert connector.withdraw("mv-never-sent") is None


def test_a_running_jobs_move_waits_held_on_its_pinned_node_until_released(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, tmp_path: Path
) -> None:
    # A job runs on A; its script names A's node, which B does not have.
    script = slurm.jobs_dir / f"pinned-{tmp_path.name}.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodelist=node2\nsleep 600\n")
    running = slurm.run(
        "sbatch",
        "--parsable",
        f"--chdir={slurm.jobs_dir}",
        "--output=/dev/null",
        "--gres=gpu:1",
        str(script),
    ).strip()
    slurm.wait_state(running, "RUNNING")
    spec = next(j for j in slurm.connector().read_state().jobs if j.external_id == running).submit
    assert spec is not None

    # B submits it held and pinned to bnode2 (bnode1 is free too: Slurm would take it first).
    on_b = ConnectorStepExecutor(slurm_b.connector(), cluster="hpc-b", state_dir=tmp_path)
    name = f"mv-hpc-test-run-{running}"
    step = {"spec": spec.model_dump(mode="json"), "name": name, "source_cluster": "hpc-test"}
    report = on_b.run(_step("submit", running, nodes=["bnode2"], hold=True, **step))
    assert report.ok, report.error
    assert report.result["held"] is True and report.result["nodes"] == ["bnode2"]
    moved = report.result["external_id"]
    row = slurm_b.job(moved)
    assert row["state"] == "PENDING" and row["reason"] == "JobHeldUser", row
    assert "ReqNodeList=bnode2" in slurm_b.scontrol_job(moved)
    # Resent (another key): the same job, neither released nor re-pinned.
    again = on_b.run(_step("submit", running, nodes=["bnode1"], **step))
    assert again.ok and again.result["external_id"] == moved, again.error
    assert slurm_b.job(moved)["state"] == "PENDING"

    # The image is staged: release, and Slurm starts it where it was pinned.
    released = on_b.run(_step("release", moved))
    assert released.ok, released.error
    assert slurm_b.wait_state(moved, "RUNNING")["nodelist"] == "bnode2"


def test_a_moves_home_cancel_tells_its_own_cancel_from_a_users(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The held home copy of a pending job's move is cancelled once the target has its own.
    A resend after the journal was lost finds its stamp (AdminComment) and succeeds; a job
    the user cancelled meanwhile fails the step for good, so the saga withdraws the
    target's copy instead of running a job its user cancelled."""
    filler = slurm.sbatch("-N3", "--gres=gpu:2")
    slurm.wait_state(filler, "RUNNING")
    moving, cancelled_by_user = slurm.sbatch("--gres=gpu:1"), slurm.sbatch("--gres=gpu:1")
    for job_id in (moving, cancelled_by_user):
        slurm.wait_state(job_id, "PENDING")
        slurm.run("scontrol", "hold", job_id)  # the move's hold step

    key = "a17:forward:cancel:2"
    on_a = ConnectorStepExecutor(slurm.connector(), cluster="hpc-test", state_dir=tmp_path / "a")
    report = on_a.run(_step("cancel", moving, key=key, moved_away=True))
    assert report.ok, report.error
    slurm.wait_state(moving, "CANCELLED")
    assert slurm.run("scontrol", "show", "job", moving).count(f"AdminComment=shaper-step:{key}")
    # The connector died before it journalled the answer: a new one runs the step again.
    again = ConnectorStepExecutor(slurm.connector(), cluster="hpc-test", state_dir=tmp_path / "b")
    resent = again.run(_step("cancel", moving, key=key, moved_away=True))
    assert resent.ok and resent.outcome is Outcome.executed, resent.error

    slurm.run("scancel", cancelled_by_user)  # the user changes their mind mid-move
    slurm.wait_state(cancelled_by_user, "CANCELLED")
    refused = on_a.run(_step("cancel", cancelled_by_user, moved_away=True))
    assert not refused.ok and not refused.retryable
    assert "it is CANCELLED and this move did not cancel it" in (refused.error or "")
    # A plain cancel (not a move's) stays idempotent whoever ended the job.
    plain = on_a.run(_step("cancel", cancelled_by_user))
    assert plain.ok, plain.error
