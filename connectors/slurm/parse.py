"""Slurm's JSON (slurmrestd or the CLI's ``--json``) → our types: openapi v0.0.36–v0.0.38
(Slurm 22.05) as written here, data_parser v0.0.40–v0.0.42 (Slurm 23.11–24.11) read as
those by :mod:`connectors.slurm.versions`.

Pure functions over already-decoded documents, so fixtures test them without a cluster.

Where the versions differ (all measured on Slurm 22.05.8):

* v0.0.36 nodes have no ``partitions`` and no ``state_flags`` (a drained node shows only its
  base state and a ``reason``), and v0.0.36 jobs have an empty ``user_name``;
* v0.0.36/37 ``job_resources.allocated_nodes`` is a dict keyed by position without node
  names, v0.0.38 a list with ``nodename`` — so node names always come from ``nodes``;
* everything else the connector reads has the same key and meaning in all three.

An elastic training job (wire.telemetry.JobReport: a block job with ``max_replicas``) is
one whose node count may change: ``sbatch --nodes=MIN-MAX`` (Slurm starts it on as many
as it finds, up to MAX) or the tag ``shaper:nodes=MIN-MAX`` in its comment. Slurm forgets
the range once the job starts (``node_count`` becomes the nodes it got, ``max_nodes`` 0),
so a running job is elastic by its tag, or by the range the control plane kept from its
pending reports (app.telemetry.ingest). Its replicas are nodes; it asks for MAX.

A job's residency (wire.residency) is in words of its ``--comment``:
``shaper.io/cluster-selector=region=eu,site=ams1`` and ``shaper.io/allowed-clusters=a,b``
(:func:`comment_residency`). Not ``--constraint``: that names node features of the
cluster it is in, and Slurm holds a job whose features no node has; not
``--cluster-constraint``: Slurm takes it only inside a Slurm federation. So are its own
speeds on GPU models (wire.speeds), where the mapping honours job tags:
``shaper.io/speeds=h100=2.5,a100=1``, a model by its GRES type (``gpu_model_aliases``
maps it to the catalogue's name) or the catalogue's name (:func:`comment_speeds`).
"""

from __future__ import annotations

import logging
import pwd
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from connectors.base import ConnectorError
from connectors.slurm.config import SUPPORTED_API_VERSIONS, SlurmMapping
from connectors.slurm.hostlist import expand_hostlist, expand_index_list
from connectors.slurm.stamps import Pin, read_pin
from connectors.slurm.submission import (
    ENDED_STATES,
    MOVE_MARK,
    YEAR_MINUTES,
    OptionValue,
    not_movable,
    submit_options,
)
from connectors.slurm.versions import is_data_parser, legacy_job, legacy_node
from wire.residency import CLUSTERS_KEY, SELECTOR_KEY, Residency, read_residency
from wire.speeds import SPEEDS_KEY, read_speeds
from wire.telemetry import (
    MAX_REPLICAS,
    TERMINAL_JOB_STATES,
    AllocationReport,
    JobKind,
    JobReport,
    JobState,
    NodeReport,
    NodeState,
)

logger = logging.getLogger(__name__)

Document = dict[str, Any]

# Base job states and the flag names job_state_string() prints instead of them (22.05).
_JOB_STATES: dict[str, JobState] = {
    "PENDING": JobState.pending,
    "RUNNING": JobState.running,
    "SUSPENDED": JobState.suspended,
    "COMPLETED": JobState.finished,
    "CANCELLED": JobState.cancelled,
    "FAILED": JobState.failed,
    "TIMEOUT": JobState.failed,
    "NODE_FAIL": JobState.failed,
    "PREEMPTED": JobState.cancelled,
    "BOOT_FAIL": JobState.failed,
    "DEADLINE": JobState.failed,
    "OUT_OF_MEMORY": JobState.failed,
    # Flags: resources are still held while these last.
    "COMPLETING": JobState.running,
    "CONFIGURING": JobState.running,
    "RESIZING": JobState.running,
    "SIGNALING": JobState.running,
    "STAGE_OUT": JobState.running,
    "STOPPED": JobState.suspended,
    # Flags of a job going back to the queue.
    "REQUEUED": JobState.pending,
    "REQUEUE_FED": JobState.pending,
    "REQUEUE_HOLD": JobState.pending,
    "SPECIAL_EXIT": JobState.pending,
    "RESV_DEL_HOLD": JobState.pending,
    "REVOKED": JobState.cancelled,
}
_HOLDS_RESOURCES = frozenset({JobState.running, JobState.suspended})
# The jobs that report how to submit them elsewhere (a federated move): pending ones, and
# running ones (a checkpointable job's move checkpoints it here and restores it there).
# A job that is ending (COMPLETING, STAGE_OUT: reported running) has nothing left to move,
# and a suspended one is not taken while stopped.
_MOVABLE_STATES = frozenset({JobState.pending, JobState.running})

_DOWN_BASE_STATES = frozenset({"down", "error", "future", "unknown", "invalid", "inval"})
_UP_BASE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
_DOWN_FLAGS = frozenset(
    {"NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "INVALID_REG"}
)
_DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINTENANCE"})

_GRES_DETAIL = re.compile(r"^gpu(?::[^:(]+)?:\d+\(IDX:(?P<indices>[^)]*)\)")
_TAG = re.compile(r"shaper:(\S+)")

LABEL_PARTITIONS = "slurm/partitions"
LABEL_FEATURES = "slurm/features"
LABEL_REASON = "slurm/reason"
LABEL_GRES = "slurm/gres"


@dataclass(frozen=True)
class SlurmJob:
    """A job as read, with what :class:`JobReport` has no field for."""

    report: JobReport
    slurm_state: str
    reason: str
    restart_count: int
    nodes: tuple[str, ...]
    qos: str
    account: str
    user: str
    slurm_priority: int
    reservation: str = ""  # the advanced reservation it runs in or waits for
    # What the connector's steps read and stamp (connectors.slurm.stamps): the job's
    # AdminComment, its ReqNodeList as Slurm has it (any state), whether it was submitted
    # for a move; and a pending job that Slurm (or someone) requeued since Shaper pinned it
    # for a run: that pin, to be lifted (reported with the job's nodes before).
    admin_comment: str = ""
    required_nodes: str = ""
    moved: bool = False
    stale_pin: Pin | None = None

    # Pending or running jobs that can move to another cluster (not ending, not
    # connectors.slurm.submission.not_movable): the sbatch options that reproduce them;
    # None for the others.
    submit_options: dict[str, OptionValue] | None = None

    @property
    def held(self) -> bool:
        """Held (``scontrol hold``, ``requeuehold``): Slurm gives a held job priority 0."""
        return self.slurm_priority == 0


def api_version(document: Document, *, what: str) -> str:
    """The API version of a response (22.05: ``meta.plugin.type`` ``openapi/v0.0.38``; 23.11
    and later: ``meta.plugin.data_parser`` ``data_parser/v0.0.42``); refuses versions we
    do not know."""
    meta = document.get("meta")
    plugin = meta.get("plugin") if isinstance(meta, dict) else None
    plugin = plugin if isinstance(plugin, dict) else {}
    parser, plugin_type = plugin.get("data_parser"), plugin.get("type")
    named = parser if isinstance(parser, str) and "/" in parser else plugin_type
    if not isinstance(named, str) or "/" not in named:
        raise ConnectorError(
            f"{what}: no meta.plugin.data_parser or meta.plugin.type in Slurm's answer, "
            "cannot tell its API version",
            retryable=False,
        )
    version = named.rsplit("/", 1)[1]
    if version not in SUPPORTED_API_VERSIONS:
        known = ", ".join(SUPPORTED_API_VERSIONS)
        raise ConnectorError(
            f"{what}: Slurm answered with API {named!r}; this connector knows {known} "
            "(Slurm 22.05 to 24.11). Configure a supported version (slurmrestd: "
            "rest_api_version)",
            retryable=False,
        )
    return version


def raise_for_errors(document: Document, *, what: str) -> None:
    errors = document.get("errors") or []
    if errors:
        details = "; ".join(_error_text(error) for error in errors)
        raise ConnectorError(f"{what}: Slurm reported errors: {details}", retryable=True)


def _error_text(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    parts = [error.get("source"), error.get("description"), error.get("error")]
    return ": ".join(str(part) for part in parts if part) or str(error)


def _items(document: Document, key: str, *, what: str) -> list[Document]:
    items = document.get(key)
    if not isinstance(items, list):
        raise ConnectorError(f"{what}: Slurm's answer has no {key!r} list", retryable=False)
    return items


# --- nodes ---------------------------------------------------------------------------------


def partitions_by_node(partitions_document: Document) -> dict[str, list[str]]:
    """node → partition names, from a ``/partitions`` answer (needed for v0.0.36)."""
    result: dict[str, list[str]] = {}
    for partition in _items(partitions_document, "partitions", what="partitions"):
        for node in expand_hostlist(str(partition.get("nodes") or "")):
            result.setdefault(node, []).append(str(partition["name"]))
    return result


def parse_gres(gres: str) -> list[tuple[str | None, int]]:
    """``"gpu:h100:2(S:0-1),gpu:1"`` → ``[("h100", 2), (None, 1)]``; other GRES are skipped."""
    found = []
    for item in _split_gres(gres):
        gpu = _gpu_item(item)
        if gpu is not None:
            found.append(gpu)
    return found


def _gpu_item(item: str) -> tuple[str | None, int] | None:
    """``gpu``, ``gpu:2``, ``gpu:h100``, ``gpu:h100:2``, with ``gres:``/``gres/`` prefixes and
    ``(S:0-1)``/``(IDX:0)`` suffixes; ``None`` for other GRES."""
    item = item.split("(", 1)[0].strip()
    for prefix in ("gres:", "gres/"):
        item = item.removeprefix(prefix)
    parts = item.split(":")
    if parts[0] != "gpu" or len(parts) > 3:
        return None
    if len(parts) == 1:
        return None, 1
    if len(parts) == 2:
        return (None, int(parts[1])) if parts[1].isdigit() else (parts[1], 1)
    if not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def _split_gres(gres: str) -> list[str]:
    # Commas also appear inside "(S:0,2)", so split only outside parentheses.
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in gres or "":
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    items.append("".join(current).strip())
    return [item for item in items if item and item != "(null)"]


def _features(node: Document) -> list[str]:
    raw = node.get("active_features") or node.get("features") or ""
    return [feature.strip() for feature in str(raw).split(",") if feature.strip()]


def _model_name(slurm_name: str, mapping: SlurmMapping) -> str:
    return mapping.gpu_model_aliases.get(slurm_name, slurm_name)


def node_gpu_model(gres: str, features: list[str], mapping: SlurmMapping) -> str | None:
    gpus = parse_gres(gres)
    if not gpus:
        return None
    by_count: dict[str, int] = {}
    for gpu_type, count in gpus:
        if gpu_type:
            by_count[gpu_type] = by_count.get(gpu_type, 0) + count
    if by_count:
        if len(by_count) > 1:
            logger.warning("node has several GPU types %s; reporting the most numerous", by_count)
        return _model_name(max(by_count, key=lambda t: by_count[t]), mapping)
    known = {name.lower() for name in mapping.gpu_model_features}
    for feature in features:
        if feature.lower() in known:
            return _model_name(feature, mapping)
    return mapping.default_gpu_model


def node_state(node: Document, *, version: str) -> NodeState:
    base = str(node.get("state") or "unknown").lower()
    flags = {str(flag).upper() for flag in node.get("state_flags") or []}
    if base in _DOWN_BASE_STATES or flags & _DOWN_FLAGS:
        return NodeState.down
    if base.startswith("drain") or flags & _DRAIN_FLAGS:
        return NodeState.draining
    if version == "v0.0.36" and node.get("reason"):
        # v0.0.36 shows no drain flag; Slurm keeps a reason only on drained/failed nodes.
        return NodeState.draining
    if base not in _UP_BASE_STATES:
        logger.warning("unknown Slurm node state %r of %s; reporting it down", base, node["name"])
        return NodeState.down
    return NodeState.up


def parse_nodes(
    nodes_document: Document,
    mapping: SlurmMapping,
    *,
    partitions_document: Document | None = None,
) -> list[NodeReport]:
    version = api_version(nodes_document, what="nodes")
    raise_for_errors(nodes_document, what="nodes")
    by_node = partitions_by_node(partitions_document) if partitions_document else None
    reports = []
    for item in _items(nodes_document, "nodes", what="nodes"):
        node = legacy_node(item) if is_data_parser(version) else item
        name = str(node["name"])
        gres = str(node.get("gres") or "")
        features = _features(node)
        gpu_count = sum(count for _, count in parse_gres(gres))
        partitions = by_node.get(name, []) if by_node is not None else node.get("partitions")
        if partitions is None:
            raise ConnectorError(
                f"nodes ({version}): node {name} has no partitions and no partition list was read",
                retryable=False,
            )
        labels = {LABEL_PARTITIONS: ",".join(sorted(partitions))[:255]}
        if features:
            labels[LABEL_FEATURES] = ",".join(features)[:255]
        if gres:
            labels[LABEL_GRES] = gres[:255]
        if node.get("reason"):
            labels[LABEL_REASON] = str(node["reason"])[:255]
        reports.append(
            NodeReport(
                name=name,
                gpu_model=node_gpu_model(gres, features, mapping) if gpu_count else None,
                gpu_count=gpu_count,
                cpu_cores=int(node.get("cpus") or 0),
                memory_mib=int(node.get("real_memory") or 0),
                labels=labels,
                state=node_state(node, version=version),
            )
        )
    return reports


# --- jobs ----------------------------------------------------------------------------------


def job_state(raw: str) -> JobState:
    state = _JOB_STATES.get(raw.upper())
    if state is None:
        logger.warning("unknown Slurm job state %r; reporting it pending", raw)
        return JobState.pending
    return state


def _time(value: Any) -> datetime | None:
    if isinstance(value, dict):  # {"set": bool, "number": int} in later API versions
        value = value.get("number") if value.get("set", True) else None
    if not value or not isinstance(value, int) or value <= 0:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def time_limit_s(value: Any) -> float | None:
    """A job's ``time_limit`` (minutes) in seconds; None for none: null, unset, INFINITE
    (``UNLIMITED``, a sentinel or ``{"infinite": true}`` in later APIs), 0, and a year or
    more — Slurm's backfill writes a year (``YEAR_MINUTES``) into the limit of a job
    without one that it starts, so on a partition without limits the same job reads null
    or a year depending on which scheduler started it. A partition's own default limit
    counts (Slurm enforces it as the job's)."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return None
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if value <= 0 or value >= YEAR_MINUTES:  # and NO_VAL, INFINITE
        return None
    return value * 60.0


def _tres_gpus(tres: str) -> tuple[int, list[str]]:
    """``"gres:gpu:h100:2"`` → ``(2, ["h100"])``; models are the GRES types named."""
    count, models = 0, []
    for gpu_type, gpu_count in parse_gres(tres):
        count += gpu_count
        if gpu_type:
            models.append(gpu_type)
    return count, models


def requested_gpus(job: Document) -> tuple[int, list[str]]:
    nodes = max(int(job.get("node_count") or 1), 1)
    tasks = max(int(job.get("tasks") or 1), 1)
    per_node, models_node = _tres_gpus(str(job.get("tres_per_node") or ""))
    per_job, models_job = _tres_gpus(str(job.get("tres_per_job") or ""))
    per_task, models_task = _tres_gpus(str(job.get("tres_per_task") or ""))
    total = per_node * nodes + per_job + per_task * tasks
    return total, sorted(set(models_node + models_job + models_task))


def allocations(job: Document, nodes: list[str]) -> list[AllocationReport]:
    """One allocation per node; ``gres_detail[i]`` belongs to the i-th node of ``nodes``."""
    details = job.get("gres_detail") or []
    result = []
    for position, node in enumerate(nodes):
        indices: list[int] = []
        if position < len(details):
            for item in _split_gres(str(details[position])):
                match = _GRES_DETAIL.match(item)
                if match:
                    indices.extend(expand_index_list(match.group("indices")))
        result.append(AllocationReport(node=node, gpu_indices=sorted(set(indices))))
    return result


def parse_tags(text: str) -> dict[str, str]:
    """``"… shaper:kind=training,sla=gold …"`` → ``{"kind": "training", "sla": "gold"}``."""
    match = _TAG.search(text or "")
    if match is None:
        return {}
    tags = {}
    for pair in match.group(1).split(","):
        key, separator, value = pair.partition("=")
        if separator and key.strip():
            tags[key.strip().lower()] = value.strip()
    return tags


def _user_name(job: Document) -> str:
    name = str(job.get("user_name") or "")
    if name:
        return name
    user_id = job.get("user_id")
    if isinstance(user_id, int):
        try:
            return pwd.getpwuid(user_id).pw_name
        except KeyError:
            return f"uid{user_id}"
    return ""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def classify(
    *,
    job_id: str,
    name: str,
    comment: str,
    qos: str,
    partition: str,
    account: str,
    user: str,
    mapping: SlurmMapping,
) -> tuple[JobKind, int, str, bool]:
    """Kind, priority, SLA class and checkpointability of one job (see ``config``)."""
    kind, priority = mapping.default_kind, mapping.default_priority
    sla_class, checkpointable = mapping.default_sla_class, False
    for rule in mapping.rules:
        if (
            (rule.qos is None or rule.qos == qos)
            and (rule.partition is None or rule.partition in partition.split(","))
            and (rule.account is None or rule.account == account)
            and (rule.user is None or rule.user == user)
            and (rule.name_prefix is None or name.startswith(rule.name_prefix))
        ):
            kind = rule.kind or kind
            priority = rule.priority if rule.priority is not None else priority
            sla_class = rule.sla_class or sla_class
            if rule.checkpointable is not None:
                checkpointable = rule.checkpointable
    if mapping.honor_job_tags:
        tags = parse_tags(comment) or parse_tags(name)
        for key, value in tags.items():
            if key == "kind" and value in JobKind.__members__:
                kind = JobKind(value)
            elif key in ("sla", "sla_class") and 0 < len(value) <= 64:
                sla_class = value
            elif key == "priority" and value.isdigit() and int(value) <= 1_000_000:
                priority = int(value)
            elif key in ("checkpointable", "checkpoint") and value.lower() in _TRUE | _FALSE:
                checkpointable = value.lower() in _TRUE
            elif key == "nodes":
                pass  # node_range reads it
            else:
                logger.warning("job %s: ignoring shaper tag %s=%r", job_id, key, value)
    return kind, priority, sla_class, checkpointable


_RANGE = re.compile(r"(\d{1,6})-(\d{1,6})")


def node_range(
    job: Document, *, comment: str, name: str, mapping: SlurmMapping
) -> tuple[int, int] | None:
    """An elastic training job's node range (see the module docstring): its tag
    ``shaper:nodes=MIN-MAX``, else the range a pending job was submitted with; None for a
    job of one node count, and for one whose GPUs are not all asked per node
    (``--gpus``, ``--gpus-per-task``: more nodes would not mean more GPUs, and a replica
    would not be a node's GPUs). A tag that is not a range 1 <= MIN <= MAX is ignored,
    with a warning."""
    job_id = str(job.get("job_id"))
    per_node, _ = _tres_gpus(str(job.get("tres_per_node") or ""))
    per_job, _ = _tres_gpus(str(job.get("tres_per_job") or ""))
    per_task, _ = _tres_gpus(str(job.get("tres_per_task") or ""))
    if not per_node or per_job or per_task:
        return None
    if mapping.honor_job_tags:
        tag = (parse_tags(comment) or parse_tags(name)).get("nodes")
        if tag is not None:
            found = _RANGE.fullmatch(tag)
            low, high = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
            if 1 <= low <= high <= MAX_REPLICAS:
                return (low, high) if high > low else None
            logger.warning("job %s: ignoring shaper tag nodes=%r (not MIN-MAX)", job_id, tag)
    if job_state(str(job.get("job_state") or "")) is not JobState.pending:
        return None
    low = max(int(job.get("node_count") or 1), 1)
    high = int(job.get("max_nodes") or 0)
    return (low, min(high, MAX_REPLICAS)) if high > low else None


def _comment_words(comment: str) -> dict[str, str]:
    """A comment's ``key=value`` words, each split at its first ``=``."""
    return dict(word.partition("=")[::2] for word in comment.split() if "=" in word)


def comment_residency(comment: str, *, job: str) -> Residency | None:
    """The residency words of a job's comment say (see the module docstring)."""
    words = _comment_words(comment)
    return read_residency(
        {k: v for k, v in words.items() if k in (SELECTOR_KEY, CLUSTERS_KEY)}, job=job
    )


def comment_speeds(comment: str, *, job: str, mapping: SlurmMapping) -> dict[str, float]:
    """The speeds word of a job's comment (see the module docstring), where the mapping
    honours what a job says of itself: like a tag's priority, a speed weighs in the plan."""
    if not mapping.honor_job_tags:
        return {}
    return read_speeds(
        _comment_words(comment).get(SPEEDS_KEY),
        job=job,
        model_name=lambda name: _model_name(name, mapping),
    )


def parse_job(job: Document, mapping: SlurmMapping) -> SlurmJob:
    job_id = str(job["job_id"])
    raw_state = str(job.get("job_state") or "")
    state = job_state(raw_state)
    nodes = expand_hostlist(str(job.get("nodes") or "")) if state in _HOLDS_RESOURCES else []
    name = str(job.get("name") or "")
    qos = str(job.get("qos") or "")
    partition = str(job.get("partition") or "")
    account = str(job.get("account") or "")
    user = _user_name(job)
    comment = str(job.get("comment") or "")
    kind, priority, sla_class, checkpointable = classify(
        job_id=job_id,
        name=name,
        comment=comment,
        qos=qos,
        partition=partition,
        account=account,
        user=user,
        mapping=mapping,
    )
    restarts = int(job.get("restart_cnt") or 0)
    admin_comment = str(job.get("admin_comment") or "")
    slurm_required = str(job.get("required_nodes") or "")
    moved = any(word.startswith(MOVE_MARK) for word in comment.split())
    pin = read_pin(admin_comment, moved=moved, required_nodes=slurm_required)
    stale_pin = (
        pin
        if pin is not None
        and raw_state.upper() == "PENDING"  # what the lift waits for (REQUEUE_HOLD…: not yet)
        and pin.stale(restarts=restarts, required_nodes=slurm_required)
        else None
    )
    required = "" if state is not JobState.pending else slurm_required
    if stale_pin is not None:
        required = stale_pin.before
    gpus, models = requested_gpus(job)
    job_allocations = allocations(job, nodes)
    allocated = sum(len(a.gpu_indices) for a in job_allocations)
    team = account if mapping.team_from == "account" and account else user
    elastic = node_range(job, comment=comment, name=name, mapping=mapping)
    low, high = elastic or (0, 0)
    report = JobReport(
        external_id=job_id,
        name=name[:255],
        team=(team or "default")[:128],
        queue=(partition or "default")[:128],
        kind=kind,
        priority=priority,
        sla_class=sla_class,
        gpus_requested=max(gpus, allocated),
        allowed_gpu_models=[_model_name(m, mapping) for m in models],
        required_nodes=expand_hostlist(required),
        gang_size=max(int(job.get("node_count") or 1), 1),
        checkpointable=checkpointable,
        min_replicas=low,
        max_replicas=high,
        replicas=high,
        submit_time=_time(job.get("submit_time")),
        start_time=_time(job.get("start_time")) if state is not JobState.pending else None,
        end_time=_time(job.get("end_time")) if state in TERMINAL_JOB_STATES else None,
        state=state,
        reason=str(job.get("state_reason") or "")[:255],
        restart_count=restarts,
        time_limit_s=time_limit_s(job.get("time_limit")),
        speeds=comment_speeds(comment, job=job_id, mapping=mapping),
        allocations=job_allocations,
        residency=comment_residency(comment, job=job_id),
    )
    return SlurmJob(
        report=report,
        slurm_state=raw_state,
        reason=str(job.get("state_reason") or ""),
        restart_count=restarts,
        nodes=tuple(nodes),
        qos=qos,
        account=account,
        user=user,
        slurm_priority=int(job.get("priority") or 0),
        reservation=str(job.get("resv_name") or ""),
        admin_comment=admin_comment,
        required_nodes=slurm_required,
        moved=moved,
        stale_pin=stale_pin,
        submit_options=(
            submit_options(job)
            if state in _MOVABLE_STATES
            and raw_state.upper() not in ENDED_STATES
            and not_movable(job) is None
            else None
        ),
    )


def parse_jobs(jobs_document: Document, mapping: SlurmMapping) -> list[SlurmJob]:
    version = api_version(jobs_document, what="jobs")
    raise_for_errors(jobs_document, what="jobs")
    jobs = _items(jobs_document, "jobs", what="jobs")
    if is_data_parser(version):
        jobs = [legacy_job(job) for job in jobs]
    return [parse_job(job, mapping) for job in jobs]
