"""Whether a Slurm job a move submitted ran (connectors.slurm.arrival): the one rule the
move's confirm (``check_arrival``) and its undoing (``withdraw``) share, over squeue lines
as the connector reads them, and against the real Slurm of tests/connectors/conftest.

The lines' values are Slurm 22.05.8's own (tests/connectors/data/slurm-22.05-recorded/
squeue.json, printed as squeue's ``-o`` prints them): job 3 was cancelled while pending
and carries a start time equal to its end and no nodes; jobs 1 and 2 were cancelled while
running and keep their node lists."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from connectors.base import ConnectorError
from connectors.slurm.arrival import (
    LISTED_FORMAT,
    WITHDRAWN_MARK,
    check_listed,
    parse_listed,
    ran_here,
)
from connectors.slurm.submission import (
    live_moved_jobs,
    ran_moved_jobs,
    withdrawn_comment,
    withdrawn_moved_jobs,
)
from tests.connectors.conftest import SlurmCluster

RECORDED = Path(__file__).parent / "data" / "slurm-22.05-recorded" / "squeue.json"
MOVE = "mv-hpc-a-77"


def _line(job: dict[str, Any], *, comment: str = f"shaper-move:{MOVE}") -> str:
    """A recorded job as ``squeue -h -o LISTED_FORMAT`` prints it."""

    def when(epoch: int) -> str:
        return datetime.fromtimestamp(epoch).isoformat() if epoch else "N/A"

    return "|".join(
        [
            str(job["job_id"]),
            job["job_state"],
            when(job["start_time"]),
            when(job["end_time"]),
            job["nodes"],
            job["state_reason"],
            comment,
        ]
    )


def _recorded(job_id: int, **changes: Any) -> dict[str, Any]:
    jobs = json.loads(RECORDED.read_text())["jobs"]
    return {**next(j for j in jobs if j["job_id"] == job_id), **changes}


def _one(job: dict[str, Any]) -> Any:
    (listed,) = parse_listed(_line(job))
    return listed


def test_a_job_cancelled_in_its_queue_did_not_run_and_one_cancelled_while_running_did() -> None:
    in_queue = _recorded(3)  # CANCELLED, start == end, no nodes
    assert in_queue["start_time"] == in_queue["end_time"] and not in_queue["nodes"]
    assert not ran_here(_one(in_queue))
    assert ran_here(_one(_recorded(1)))  # CANCELLED 92 s after it started on node1


def test_a_job_that_failed_in_the_second_it_started_ran() -> None:
    # One-second times: its start equals its end, and only its node list tells it from a
    # job Slurm failed in the queue (an account it no longer accepts: no nodes).
    started = _recorded(1, job_state="FAILED", end_time=1796206876, state_reason="NonZeroExitCode")
    in_queue = _recorded(3, job_state="FAILED", state_reason="InvalidAccount")
    assert ran_here(_one(started))
    assert not ran_here(_one(in_queue))
    # COMPLETED and the other states only a started job reaches: the same.
    for state in ("COMPLETED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
        assert ran_here(_one({**started, "job_state": state}))
    # Cancelled in that second, or its nodes never booted: taken as never run.
    assert not ran_here(_one({**started, "job_state": "CANCELLED"}))
    assert not ran_here(_one({**_recorded(1), "job_state": "BOOT_FAIL"}))


def test_the_confirm_and_the_withdraw_agree_on_every_ended_job() -> None:
    """The finding this rule mends: a copy that failed in the second it started was
    "rejected" by the confirm and "ran" for the withdraw, so the move's undoing was refused
    and the home copy stayed held for ever."""
    base = [_recorded(1), _recorded(2), _recorded(3)]
    cases = [
        *base,
        _recorded(1, job_state="FAILED", end_time=1796206876, state_reason="NonZeroExitCode"),
        _recorded(3, job_state="FAILED", state_reason="InvalidAccount"),
        _recorded(1, job_state="COMPLETED", end_time=1796206876),
        _recorded(1, job_state="CANCELLED", end_time=1796206876),
        _recorded(2, job_state="TIMEOUT"),
    ]
    for job in cases:
        line = _line(job)
        refused = bool(ran_moved_jobs(line, MOVE))
        try:
            said = check_listed(parse_listed(line)[0], str(job["job_id"]))
        except ConnectorError as error:
            assert not error.retryable, error
            assert not refused, f"{line}: rejected by the confirm, refused by the withdraw"
            assert live_moved_jobs(line, MOVE) == []  # ended: nothing left to cancel
        else:
            assert "the move took place" in said
            assert refused, f"{line}: accepted by the confirm, undone by the withdraw"


def test_a_copy_cancelled_after_it_ran_took_place_unless_its_withdraw_cancelled_it() -> None:
    """The finding this mends: CANCELLED after an hour of running was "ran" for the confirm
    (the home copy cancelled) and nothing for the withdraw (the home copy released): run
    twice. Now someone's scancel after a run is "ran" for both, and only the cancel the
    withdraw stamped is its own."""
    hour = _recorded(1, start_time=1796206876, end_time=1796206876 + 3600)
    assert hour["job_state"] == "CANCELLED" and hour["nodes"]
    users = _line(hour)
    assert "the move took place" in check_listed(parse_listed(users)[0], "1")
    assert ran_moved_jobs(users, MOVE) == [("1", "CANCELLED")]  # the withdraw refuses
    assert withdrawn_moved_jobs(users, MOVE) == []

    own = _line(hour, comment=withdrawn_comment(f"shaper-move:{MOVE}", MOVE))
    assert f"{WITHDRAWN_MARK}{MOVE}" in own
    with pytest.raises(ConnectorError, match="withdrawn by its move") as rejected:
        check_listed(parse_listed(own)[0], "1")
    assert not rejected.value.retryable
    assert ran_moved_jobs(own, MOVE) == []
    assert withdrawn_moved_jobs(own, MOVE) == ["1"]  # a resend answers as the first did
    assert live_moved_jobs(own, MOVE) == []
    # Stamped once, whatever the comment held.
    assert withdrawn_comment(withdrawn_comment("run 42", MOVE), MOVE) == (
        f"run 42 {WITHDRAWN_MARK}{MOVE}"
    )


@pytest.mark.parametrize(
    ("state", "reason", "accepted"),
    [
        ("PENDING", "Resources", True),
        ("PENDING", "JobHeldUser", True),
        ("RUNNING", "None", True),
        ("PENDING", "InvalidQOS", False),
        ("PENDING", "BadConstraints", False),
    ],
)
def test_a_queued_or_running_copy_is_accepted_unless_its_reason_never_resolves(
    state: str, reason: str, accepted: bool
) -> None:
    line = f"77|{state}|N/A|N/A||{reason}|shaper-move:{MOVE}"
    if accepted:
        assert check_listed(parse_listed(line)[0], "77") == f"job 77 is {state} ({reason})"
    else:
        with pytest.raises(ConnectorError, match="a reason no wait resolves") as rejected:
            check_listed(parse_listed(line)[0], "77")
        assert not rejected.value.retryable
    assert live_moved_jobs(line, MOVE) == ["77"]


def test_a_comment_with_a_bar_and_a_line_of_another_shape_are_read_as_they_are() -> None:
    listed = parse_listed(
        "slurm_load_jobs warning\n"
        f"8|PENDING|N/A|N/A||Priority|run|42 shaper-move:{MOVE}\n"
        "9|RUNNING|2026-12-04T10:00:00|2027-12-04T10:00:00|node[1-2]|None|\n"
    )
    assert [(j.job_id, j.comment, j.nodes) for j in listed] == [
        ("8", f"run|42 shaper-move:{MOVE}", ""),
        ("9", "", "node[1-2]"),
    ]
    assert listed[0].start is None and listed[1].start == datetime(2026, 12, 4, 10)
    with pytest.raises(ConnectorError, match="does not report job 77 yet") as unknown:
        check_listed(None, "77")
    assert unknown.value.retryable


def test_on_a_real_slurm_the_confirm_and_the_withdraw_agree(slurm: SlurmCluster) -> None:
    """A moved copy that fails at once ran (the confirm accepts it, the withdraw refuses to
    undo it); one cancelled in the queue did not (rejected; the withdraw finds nothing
    left to cancel); one the withdraw cancelled while it ran is withdrawn, twice alike;
    one someone cancelled after it ran took place; one squeue no longer knows is not
    known yet."""
    connector = slurm.connector()
    failed = slurm.sbatch(f"--comment=shaper-move:{MOVE}-f", command="exit 3")
    slurm.wait_state(failed, "FAILED")
    assert "after it ran here: the move took place" in connector.check_arrival(failed)
    with pytest.raises(ConnectorError, match="already ran here and ended FAILED") as refused:
        connector.withdraw(f"{MOVE}-f")
    assert not refused.value.retryable

    queued = slurm.sbatch("--hold", f"--comment=shaper-move:{MOVE}-q")
    slurm.run("scancel", queued)
    slurm.wait_state(queued, "CANCELLED")
    listed = slurm.run("squeue", "-h", "-t", "all", "-j", queued, "-o", LISTED_FORMAT)
    (row,) = parse_listed(listed)
    assert row.start == row.end and row.nodes == ""  # what Slurm stamps on it
    with pytest.raises(ConnectorError, match="without having run") as rejected:
        connector.check_arrival(queued)
    assert not rejected.value.retryable
    assert connector.withdraw(f"{MOVE}-q") is None

    # Withdrawn while it runs: the cancel is the withdraw's own, and a resend says so.
    running = slurm.sbatch(f"--comment=shaper-move:{MOVE}-w")
    slurm.wait_state(running, "RUNNING")
    assert connector.withdraw(f"{MOVE}-w") == running
    slurm.wait_state(running, "CANCELLED")
    assert connector.withdraw(f"{MOVE}-w") == running
    with pytest.raises(ConnectorError, match="withdrawn by its move") as undone:
        connector.check_arrival(running)
    assert not undone.value.retryable

    # Cancelled by someone after it ran a while: the move took place, for both.
    used = slurm.sbatch(f"--comment=shaper-move:{MOVE}-u")
    slurm.wait_state(used, "RUNNING")
    time.sleep(2)  # past Slurm's one-second times: its end is after its start
    slurm.run("scancel", used)
    slurm.wait_state(used, "CANCELLED")
    assert "after it ran here: the move took place" in connector.check_arrival(used)
    with pytest.raises(ConnectorError, match="already ran here and ended CANCELLED") as ran:
        connector.withdraw(f"{MOVE}-u")
    assert not ran.value.retryable

    with pytest.raises(ConnectorError, match="does not report job 999999 yet") as unknown:
        connector.check_arrival("999999")
    assert unknown.value.retryable
