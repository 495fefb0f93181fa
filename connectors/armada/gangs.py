"""Armada gangs as one Shaper job.

Armada runs a gang — jobs scheduled together, all or none, onto one executor cluster — from
three annotations on each member job (``internal/server/configuration/constants.go``):
``armadaproject.io/gangId`` (equal on every member), ``armadaproject.io/gangCardinality``
(how many members make the gang) and, optionally,
``armadaproject.io/gangNodeUniformityLabel`` (every member on nodes whose value of that
label is equal: one rack, one cluster).

Shaper sees a gang as one job (:func:`gangs`): ``external_id`` ``gang:<queue>/<job
set>/<gang id>`` (its home queue and job set: a held gang keeps its name),
``gang_size`` the cardinality, ``gpus_requested`` every member's GPUs (a member not seen
yet counted as the largest seen), one allocation per node its running members hold. It is
running while a member runs (the reason says how many), ended when every member has, and
then failed if one failed or was preempted, cancelled if one was cancelled, else finished.
A gang id used again once its gang ended (more jobs than the cardinality) names the gang
whose members have not ended.

What the connector does to a gang it does to every member (connectors.armada.connector):
cancel, reprioritize and preempt each; a requeue, hold or start that submits the work again
cancels and submits **every** member, each with the gang's annotations and a fresh gang
id (:func:`attempt_gang_id`: the cancelled members of the old gang are not counted in
the new one, whatever order Armada sees the cancels and submissions in), so the gang stays
whole. Pins spread the members over the plan's nodes (:func:`spread`). Refused, saying
why: a gang not seen whole yet (retryable); a requeue with a resume pointer (Shaper's
checkpoint is one process's, and a gang's members are separate pods: a gang is reported
not checkpointable, so no plan checkpoints one); moving a gang to another cluster (it
carries no submit spec, and a member's spec submitted alone is refused).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from connectors.armada.jobs import HOME_QUEUE_ANNOTATION, ArmadaJob, Phase
from wire.telemetry import NAME_PATTERN

GANG_ID = "armadaproject.io/gangId"
GANG_CARDINALITY = "armadaproject.io/gangCardinality"
GANG_UNIFORMITY = "armadaproject.io/gangNodeUniformityLabel"
# The gang's id as first submitted, kept on every later attempt (whose gangId is fresh).
SHAPER_GANG = "shaper.io/gang"
# A gang's external id starts so; no Armada job id does (they are ULIDs).
PREFIX = "gang:"
MAX_CARDINALITY = 10_000


def gang_id(job: ArmadaJob) -> str | None:
    """The id of the gang ``job`` belongs to as first submitted; None: not a gang member."""
    annotations = job.spec.annotations
    return annotations.get(SHAPER_GANG) or annotations.get(GANG_ID) or None


def cardinality(job: ArmadaJob) -> int:
    """The members the gang has, as the job says (Armada requires a positive whole
    number; anything else is taken as a gang of the members seen)."""
    value = job.spec.annotations.get(GANG_CARDINALITY, "")
    return min(int(value), MAX_CARDINALITY) if value.isdigit() and int(value) > 0 else 0


def attempt_gang_id(original: str, attempt: int) -> str:
    """The gangId of a gang's members submitted again for the ``attempt``-th time."""
    return original if attempt == 0 else f"{original}.shaper-{attempt}"


def external_id(job: ArmadaJob, original: str) -> str:
    home = job.spec.annotations.get(HOME_QUEUE_ANNOTATION, job.queue)
    name = f"{PREFIX}{home}/{job.job_set}/{original}"
    if re.fullmatch(NAME_PATTERN, name):
        return name
    digest = hashlib.sha256(f"{home}\0{job.job_set}\0{original}".encode()).hexdigest()
    return f"{PREFIX}{digest[:40]}"


@dataclass(frozen=True)
class Gang:
    external_id: str
    gang_id: str
    cardinality: int
    members: tuple[ArmadaJob, ...]  # each member workload's newest job, by workload id

    @property
    def whole(self) -> bool:
        """Every member was seen (their submissions are in the followed job sets' events)."""
        return len(self.members) >= self.cardinality

    @property
    def gpus(self) -> int:
        seen = sum(job.spec.gpus for job in self.members)
        largest = max((job.spec.gpus for job in self.members), default=0)
        return seen + max(0, self.cardinality - len(self.members)) * largest

    @property
    def phase(self) -> Phase:
        """The gang's phase for its report: running while a member runs; a terminal phase
        once every member ended (failed, else preempted, else cancelled, else succeeded);
        else the least advanced waiting phase."""
        phases = [job.phase for job in self.members]
        if Phase.running in phases:
            return Phase.running
        if all(job.terminal for job in self.members) and self.whole:
            for ended in (Phase.failed, Phase.preempted, Phase.cancelled):
                if ended in phases:
                    return ended
            return Phase.succeeded
        for waiting in (Phase.queued, Phase.leased, Phase.pending):
            if waiting in phases:
                return waiting
        return Phase.queued  # members ended and the rest not seen yet: waiting for them

    @property
    def reason(self) -> str:
        running = sum(job.phase is Phase.running for job in self.members)
        seen = len(self.members)
        told = f"gang {self.gang_id}: {running} of {self.cardinality} members running"
        if seen < self.cardinality:
            told += f", {seen} seen"
        return told


def gangs(current: dict[str, ArmadaJob]) -> tuple[dict[str, ArmadaJob], dict[str, Gang]]:
    """Split each workload's newest job (``current``, by workload id) into the jobs that
    are no gang's and the gangs, each by external id."""
    singles: dict[str, ArmadaJob] = {}
    grouped: dict[str, list[ArmadaJob]] = {}
    originals: dict[str, str] = {}
    for workload, job in current.items():
        original = gang_id(job)
        if original is None:
            singles[workload] = job
            continue
        key = external_id(job, original)
        grouped.setdefault(key, []).append(job)
        originals[key] = original
    found = {}
    for key, members in grouped.items():
        members.sort(key=lambda job: job.workload_id)
        size = max((cardinality(job) for job in members), default=0) or len(members)
        if len(members) > size:
            # The gang id used again for a new gang once the old one ended: the live one.
            members = [job for job in members if not job.terminal] or members
        found[key] = Gang(key, originals[key], size, tuple(members))
    return singles, found


def spread(
    members: tuple[ArmadaJob, ...], capacity: dict[str, int], nodes: list[str]
) -> dict[str, str] | str:
    """Each member's node (by workload id) when the plan places the gang on ``nodes``:
    members in order, each onto the first of ``nodes`` that has none yet and GPUs left for
    it, else the first with GPUs left (``capacity``: each declared node's GPUs), so that
    every node the plan named runs a member (the confirm checks it). Why not, when they do
    not fit (or a node is unknown)."""
    unknown = [node for node in nodes if node not in capacity]
    if unknown:
        return f"no node {', '.join(unknown)} is declared (config nodes)"
    left = {node: capacity[node] for node in nodes}
    placed: dict[str, str] = {}
    for job in members:
        fits = [n for n in nodes if left[n] >= job.spec.gpus]
        node = next((n for n in fits if n not in placed.values()), fits[0] if fits else None)
        if node is None:
            asked = "+".join(str(member.spec.gpus) for member in members)
            return f"its {len(members)} members ({asked} GPUs) do not fit there"
        left[node] -= job.spec.gpus
        placed[job.workload_id] = node
    return placed
