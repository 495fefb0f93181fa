"""A real Slurm that refuses chosen ``scontrol update``s, for the connector's answers to
what a site's Slurm may refuse where the test clusters' does not (22.05 lets a running
job leave its reservation, for one). Every other command runs as it is; what was refused,
and when each command ran, is kept for the test to look at."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.slurm.reservations import parse_reservations

if TYPE_CHECKING:
    from tests.connectors.conftest import SlurmCluster

REFUSAL = "scontrol: error: refused by the test"


def _scontrol_update(command: list[str]) -> bool:
    # The connector runs scontrol by name, or from its bin_dir (the Slurm 24.11 cluster's).
    return len(command) >= 2 and Path(command[0]).name == "scontrol" and command[1] == "update"


def leaving_a_reservation(command: list[str]) -> bool:
    """``scontrol update JobId=<id> ReservationName=``: a job asked out of its reservation."""
    return _scontrol_update(command) and command[-1] == "ReservationName="


def ending_a_reservation(command: list[str]) -> bool:
    """``scontrol update ReservationName=<name> EndTime=…``."""
    return _scontrol_update(command) and any(arg.startswith("EndTime=") for arg in command)


@dataclass
class RefusingSlurm:
    """A ``run`` for :class:`~connectors.slurm.SlurmConnector`."""

    refuses: Callable[[list[str]], bool]
    refused: list[list[str]] = field(default_factory=list)
    # (wall clock before, wall clock after, command) of each command run.
    ran: list[tuple[float, float, list[str]]] = field(default_factory=list)

    def __call__(self, command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        if self.refuses(command):
            self.refused.append(command)
            return subprocess.CompletedProcess(command, 1, "", REFUSAL)
        before = time.time()
        # SlurmCli passes check=False and reads the return code itself.
        result: subprocess.CompletedProcess[str] = subprocess.run(command, **options)
        self.ran.append((before, time.time(), command))
        return result


def reservation_state(cluster: SlurmCluster, name: str) -> str | None:
    """The reservation's state (``ACTIVE``, ``INACTIVE`` once ended); None once gone — Slurm
    purges an ended reservation itself once no job is in it. One read, so that a purge
    between two reads cannot make it fail."""
    output = cluster.run("scontrol", "show", "reservation", "--oneliner")
    return next((r.state for r in parse_reservations(output) if r.name == name), None)
