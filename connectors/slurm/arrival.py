"""Whether a Slurm job that a move submitted here ran: the one rule that both the move's
confirm (``check_arrival``) and its undoing (``withdraw``) apply, so that they never
disagree — a copy the confirm calls rejected is one the withdraw may cancel, and one that
ran here is one the withdraw refuses to undo (connectors.arrival says why each matters).

Both read the jobs as ``squeue -h -t all -o`` :data:`LISTED_FORMAT` prints them
(:func:`parse_listed`), and :func:`ran_here` judges a job from its state, its times and
its node list together, because Slurm's times alone cannot tell (measured on Slurm 22.05.8:
tests/connectors/data/slurm-22.05-recorded/squeue.json, and slurmctld's job_mgr.c):

* times have one-second resolution, so a job that starts and fails within the same second
  has a start time equal to its end time;
* slurmctld stamps a job it ends in its queue with a start time equal to its end: one
  cancelled while pending (``scancel``), and one it fails there — an account or QOS it no
  longer accepts, constraints no node can meet — FAILED without ever running;
* it keeps the node list of a job that was given nodes after that job ends; a job ended in
  its queue has none.

So: a job that ended after its start ran (but BOOT_FAIL: its nodes never booted); one that
ended in the second it started ran
only if it got nodes and its state is one only a started job reaches (COMPLETED, FAILED
on its nodes, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED). A job CANCELLED (or past its
DEADLINE) in that second is taken as never run, even with nodes: nothing tells whether its
batch script had begun, and calling it run would cancel the home copy of a job that may
never have run anywhere (lost), while calling it not run at worst runs a job again that
ran for under a second.

A CANCELLED job that ran (someone's ``scancel`` after an hour of running) ran, as for the
confirm so for the withdraw, except the cancel of the move's own withdraw: that one stamps
the job's comment with :data:`WITHDRAWN_MARK` before its ``scancel`` (the comment is the
column the move's mark is read from already), and a copy so :func:`withdrawn` did not
"run": the confirm rejects it (nothing runs here any more) and a resent withdraw answers
as the first did.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from connectors.arrival import NEVER_RUNS_REASONS, not_yet, rejected

# squeue's columns for the move's reads: id, state, start, end, node list, reason, and the
# comment last, because a comment may hold a '|' of its own.
LISTED_FORMAT = "%i|%T|%S|%e|%N|%r|%k"
_COLUMNS = LISTED_FORMAT.count("|") + 1

# What squeue's ``%T`` prints for a job that has ended (base states; the flags of a job
# still cleaning up after its end, COMPLETING and STAGE_OUT, are not an end yet).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)
# The comment word the move's withdraw adds before it cancels the job, followed by the
# move's name: the cancel is the withdraw's own, not the job's end. Not "shaper:" nor
# "shaper-move:", so neither the job's own tags nor its move's mark change.
WITHDRAWN_MARK = "shaper-withdrawn:"

# States only a job that was started on its nodes reaches; slurmctld's FAILED in the queue
# (no nodes) is told apart by the node list.
STARTED_STATES = frozenset(
    {"COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
)
# States of a job that ended without its batch script running, however long it held its
# nodes: they never booted.
NEVER_STARTED_STATES = frozenset({"BOOT_FAIL"})
# Base states squeue prints for a job that waits in the queue.
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


@dataclass(frozen=True)
class ListedJob:
    """One job as ``squeue -o LISTED_FORMAT`` prints it."""

    job_id: str
    state: str
    start: datetime | None
    end: datetime | None
    nodes: str
    reason: str
    comment: str


def parse_listed(squeue_lines: str) -> list[ListedJob]:
    """The jobs of ``squeue -h -o LISTED_FORMAT`` output; lines of another shape (a
    warning squeue printed) are skipped."""
    jobs = []
    for line in squeue_lines.splitlines():
        fields = line.split("|", _COLUMNS - 1)
        if len(fields) < _COLUMNS or not fields[0].strip():
            continue
        job_id, state, start, end, nodes, reason, comment = fields
        jobs.append(
            ListedJob(
                job_id=job_id.strip(),
                state=state.strip().upper(),
                start=_time(start),
                end=_time(end),
                nodes=nodes.strip(),
                reason=reason.strip(),
                comment=comment,
            )
        )
    return jobs


def withdrawn(job: ListedJob) -> bool:
    """Whether the move's withdraw stamped the job to cancel it (module docstring)."""
    return any(word.startswith(WITHDRAWN_MARK) for word in job.comment.split())


def ran_here(job: ListedJob) -> bool:
    """Whether the job ran here and has ended (the module's docstring says why so)."""
    if job.state not in TERMINAL_STATES or job.state in NEVER_STARTED_STATES:
        return False
    if job.state == "CANCELLED" and withdrawn(job):
        return False
    if job.start is None:
        return False
    if job.end is not None and job.end > job.start:
        return True
    return job.state in STARTED_STATES and bool(job.nodes)


def check_listed(job: ListedJob | None, external_id: str) -> str:
    """The confirm of a move's copy ``external_id`` (connectors.arrival): what was seen
    when the copy is accepted, else raises ``not_yet`` or ``rejected`` saying what."""
    if job is None:
        raise not_yet(f"the scheduler does not report job {external_id} yet")
    seen = f"job {external_id} is {job.state}" + (f" ({job.reason})" if job.reason else "")
    if job.state in TERMINAL_STATES:
        if ran_here(job):
            return f"{seen}, after it ran here: the move took place"
        if withdrawn(job):
            raise rejected(f"{seen}: withdrawn by its move")
        raise rejected(f"{seen} without having run")
    if job.state in QUEUED_STATES and job.reason in NEVER_RUNS_REASONS:
        raise rejected(f"{seen}, a reason no wait resolves")
    return seen


def _time(text: str) -> datetime | None:
    """squeue's ``%S``/``%e`` (local time, no zone: only compared with each other); None
    for its N/A, Unknown and None."""
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        return None
