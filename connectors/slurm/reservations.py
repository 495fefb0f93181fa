"""Slurm advanced reservations that hold a plan's GPUs for one job.

Slurm 22.05 reserves nodes or cores, not GPUs (``TRES=gres/gpu`` needs slurmdbd, and GRES
are not reservable there anyway), so Shaper reserves the job's **target nodes whole**, one
reservation per job, named ``<prefix><job id>``:

* ``IGNORE_JOBS`` — jobs already running there keep running (the plan frees them itself);
* ``OVERLAP`` — two jobs of one plan may share a node, each in its own reservation;
* ``FLEX`` — a job that started in the reservation survives its end. Without it Slurm
  ends the job when the reservation ends (``ResvOverRun=0``, measured here: "Reservation
  ended for JobId=4"), so a control plane that went away would cost the job its work;
* ``NO_HOLD_JOBS_AFTER_END`` — a job still waiting in it when it ends is not held by
  Slurm ("Reservation … was deleted", priority 0) but queued as any other.

Every other pending job is kept off those nodes until the reservation goes: when the
plan's action that took them ends (the control plane then sends ``unreserve``, which
takes the job out and deletes the reservation), or when it ends (its time to live; the
connector's upkeep deletes what is left). A move's reservation covers its source too,
so it must last until the move has ended, not only until the job first runs on the
target. The cost is that GPUs of those nodes that the plan does not use stay idle for
that time too: usually the seconds between a checkpoint and a start.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from connectors.slurm.hostlist import expand_hostlist

FLAGS = "IGNORE_JOBS,OVERLAP,FLEX,NO_HOLD_JOBS_AFTER_END"
# Slurm job ids (arrays and heterogeneous jobs included): a reservation named
# <prefix><something else> is somebody else's, whatever its prefix.
_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")


@dataclass(frozen=True)
class SlurmReservation:
    name: str
    nodes: tuple[str, ...]
    users: tuple[str, ...]
    state: str


def reservation_name(prefix: str, job_id: str) -> str:
    return f"{prefix}{job_id}"


def job_of(prefix: str, name: str) -> str | None:
    """The job a reservation of Shaper's holds GPUs for; None for anyone else's."""
    if not name.startswith(prefix):
        return None
    job_id = name.removeprefix(prefix)
    return job_id if _JOB_ID.match(job_id) else None


def duration_minutes(ttl_s: float) -> int:
    """Slurm counts a reservation's duration in whole minutes; never shorter than asked."""
    return max(1, math.ceil(ttl_s / 60))


def create_args(name: str, *, nodes: list[str], user: str, ttl_s: float) -> list[str]:
    return [
        "create",
        "reservation",
        f"ReservationName={name}",
        "StartTime=now",
        f"Duration={duration_minutes(ttl_s)}",
        f"Nodes={','.join(nodes)}",
        f"Users={user}",
        f"Flags={FLAGS}",
    ]


def end_now_args(name: str) -> list[str]:
    """End the reservation as soon as Slurm allows: its nodes are anyone's again, a job
    running in it runs on (FLEX).

    Not ``EndTime=now``: slurmctld refuses an end that is not after the reservation's
    start ("Invalid time specified": ``update_resv`` checks ``start_time >= end_time``),
    and scontrol reads ``now`` to the second, so ``EndTime=now`` in the second the
    reservation was made (``StartTime=now``) is refused. That happens: a pending move's
    job is released into its reservation, starts, and the move gives the reservation
    back, 0.8-1.0 s after it was made on the test clusters (which schedule every second),
    so within its second in about one run in six. ``now+1`` is after the start of any
    reservation made ``now`` here: scontrol reads ``now`` on this host for the create too
    (slurmctld keeps a start up to a minute old). Only a reservation made from a host
    whose clock is ahead, or this clock stepped back, could meet the refusal again.
    """
    return ["update", f"ReservationName={name}", "EndTime=now+1"]


def parse_reservations(output: str) -> list[SlurmReservation]:
    """``scontrol show reservation --oneliner``: one ``Key=Value …`` line per reservation.

    22.05 has no JSON for reservations in the CLI. Values never contain spaces except
    ``(null)`` markers and free text we do not read, so splitting on whitespace is enough
    for the keys used here. "No reservations in the system" gives ``[]``.
    """
    found: list[SlurmReservation] = []
    for line in output.splitlines():
        if not line.startswith("ReservationName="):
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                fields.setdefault(key, value)
        users = fields.get("Users", "")
        found.append(
            SlurmReservation(
                name=fields["ReservationName"],
                nodes=tuple(expand_hostlist(fields.get("Nodes", ""))),
                users=tuple(u for u in users.split(",") if u and u != "(null)"),
                state=fields.get("State", ""),
            )
        )
    return found
