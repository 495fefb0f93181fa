"""A Slurm job as a ``wire.telemetry.SubmitSpec``, and such a spec as an ``sbatch``.

A federated move (issue 16) submits a job of one cluster to another cluster of its group:
a pending job as it is, or a running one that its source checkpoints and the target
restores (the control plane moves only checkpointable ones; the connector reports a spec
for every running job that can move, and leaves that to it). The source's connector
reports, with every pending or running (not ending) job that can move,
``SubmitSpec(scheduler=slurm, native=…)`` whose ``native`` holds:

* ``script``: the batch script, as ``scontrol write batch_script <id> -`` prints it;
* ``options``: ``{sbatch long option: value}`` from the job's record (squeue/slurmrestd
  JSON, :func:`submit_options`): its resources, limits, names and paths — the values the
  job ended up with, whether they came from the command line or from ``#SBATCH`` lines.
  ``True`` is a bare flag (``--contiguous``);
* ``workdir``: the directory it runs in (``options["chdir"]`` too);
* ``user``: who owns it; the target runs it as that user.

The target's connector turns that into an ``sbatch`` (:func:`sbatch_request`): the script
on stdin, the options on the command line (which Slurm lets override the script's own
``#SBATCH`` lines), the partition swapped for one the target has, and a comment that
carries ``shaper-move:<name>`` so that a resent step finds the job it submitted before,
and a ``withdraw`` (the move undone) finds the job to cancel (:func:`live_moved_jobs`).

A running job's move submits it **held and pinned** (``sbatch_request(nodes=…, hold=True)``:
``--hold`` and ``--nodelist``), so that it cannot start before its checkpoint image is
staged on the target node; the control plane's ``release`` then lets Slurm start it
there, and its body restores from the image. The pin is the connector's, never the
spec's: a spec cannot carry a node list (:data:`ALLOWED_OPTIONS`), the script's own
``--nodelist``/``-w``/``--exclude`` lines are switched off, and the ``--nodelist`` on the
command line is the only one sbatch sees. A running job's options are its record's as
they are (its full time limit, not what is left of it: the restored job gets it anew).

What does not travel: ``#SBATCH`` lines that name things of the source cluster (node lists,
reservations, dependencies, clusters) are switched off; the environment sbatch captured at
the original submission is not printable by Slurm's CLI (slurmctld keeps it in its state),
so the moved job starts with a clean one (PATH, the user's HOME/USER/LOGNAME) instead of
inheriting the connector's. Jobs that cannot move at all report no spec
(:func:`not_movable`): array and heterogeneous jobs, jobs with dependencies, and jobs
without a batch script; nor do suspended jobs and jobs that are ending (COMPLETING,
STAGE_OUT), which connectors.slurm.parse leaves out.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectors.base import ConnectorError, check_move_name
from connectors.slurm.arrival import (
    TERMINAL_STATES,
    WITHDRAWN_MARK,
    ListedJob,
    parse_listed,
    ran_here,
    withdrawn,
)
from wire.telemetry import PortableSpec, SchedulerKind, SubmitSpec

Document = dict[str, Any]
OptionValue = str | bool

# The comment word that names the move a job was submitted for; "shaper-move:" does not
# contain "shaper:", so the job's own shaper tags (connectors.slurm.parse) stay as they were.
MOVE_MARK = "shaper-move:"

# The options a spec may carry: what submit_options writes. A spec naming any other is
# refused, so that a spec (data from another cluster) cannot smuggle in --uid, --export,
# --wrap or a node list (a move's pin to the target's nodes is the target connector's own
# --nodelist, added after this check: sbatch_request(nodes=…)).
ALLOWED_OPTIONS = frozenset(
    {
        "job-name",
        "comment",
        "chdir",
        "output",
        "error",
        "input",
        "partition",
        "account",
        "qos",
        "nodes",
        "ntasks",
        "ntasks-per-node",
        "cpus-per-task",
        "mem",
        "mem-per-cpu",
        "mem-per-gpu",
        "time",
        "time-min",
        "gres",
        "gpus",
        "gpus-per-task",
        "cpus-per-gpu",
        "constraint",
        "contiguous",
        "licenses",
        "requeue",
        "no-requeue",
    }
)
_FLAGS = frozenset({"contiguous", "requeue", "no-requeue"})

# #SBATCH lines that name things of the source cluster; Slurm would apply them on the
# target (options on the command line override the script's, but these are not passed).
# With them off, a pinned submit's --nodelist is the only node list sbatch sees, and no
# --exclude of the script's can contradict it.
_SOURCE_BOUND = frozenset(
    {"nodelist", "w", "exclude", "x", "reservation", "dependency", "d", "clusters", "M"}
)
_DIRECTIVE = re.compile(r"^#SBATCH\s+--?([A-Za-z][A-Za-z-]*)")
# Must not start with "#SBATCH": sbatch reads "#SBATCH-X" as the directive "-X".
SWITCHED_OFF = "#SHAPER-OFF:SBATCH"

# A moved job's environment: what a login shell would have, nothing of the connector's.
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
# A node of the target to pin a moved job to: one host name (no hostlist expressions).
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_OPTION_LENGTH = 4096


# --- the source side: a job's record → options ----------------------------------------------


# Slurm's backfill stand-in for "no limit" (src/plugins/sched/backfill: YEAR_MINUTES): it
# writes a year into the limit of a job without one that it starts.
YEAR_MINUTES = 365 * 24 * 60


def _number(value: Any) -> int | None:
    """Slurm's numbers: plain ints, or ``{"set": bool, "number": int}`` in later APIs;
    None when unset (Slurm prints unset limits as None or NO_VAL-like sentinels)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    # NO_VAL/INFINITE (0xfffffffe/0xffffffff and their 16- and 64-bit kin) mean "unset".
    if value < 0 or value >= 0xFFFFFFFE:
        return None
    return value


def _text(job: Document, key: str) -> str:
    value = job.get(key)
    return str(value).strip() if value not in (None, "") else ""


def _tres_gpus(tres: str) -> str:
    """``"gres:gpu:h100:2"`` → ``"h100:2"``, ``"gres:gpu:2"`` → ``"2"``; "" without GPUs."""
    for item in tres.split(","):
        parts = item.strip().removeprefix("gres:").removeprefix("gres/").split(":")
        if parts[0] == "gpu" and len(parts) > 1:
            return ":".join(parts[1:])
    return ""


def _tres_number(tres: str) -> int | None:
    """``"gres:gpu:4"`` → 4: the per-GPU amount of ``cpus_per_tres``/``memory_per_tres``."""
    amount = _tres_gpus(tres).rsplit(":", 1)[-1]
    return int(amount) if amount.isdigit() else None


def not_movable(job: Document) -> str | None:
    """Why this job cannot be submitted elsewhere; None when it can."""
    if _number(job.get("array_job_id")) or _text(job, "array_task_string"):
        return "an array job"
    if _number(job.get("het_job_id")):
        return "a heterogeneous job"
    if _text(job, "dependency"):
        return "it depends on jobs of its own cluster"
    if job.get("batch_flag") is False:
        return "it has no batch script (salloc or srun)"
    return None


def submit_options(job: Document) -> dict[str, OptionValue]:
    """The sbatch options that reproduce a job, from its squeue/slurmrestd record."""
    options: dict[str, OptionValue] = {}

    def put(option: str, value: str | int | None) -> None:
        if value not in (None, ""):
            options[option] = str(value)

    put("job-name", _text(job, "name"))
    put("comment", _text(job, "comment"))
    put("chdir", _text(job, "current_working_directory"))
    put("output", _text(job, "standard_output"))
    put("error", _text(job, "standard_error"))
    if _text(job, "standard_input") != "/dev/null":
        put("input", _text(job, "standard_input"))
    put("partition", _text(job, "partition"))
    put("account", _text(job, "account"))
    put("qos", _text(job, "qos"))
    nodes, max_nodes = _number(job.get("node_count")), _number(job.get("max_nodes"))
    if nodes:
        put("nodes", f"{nodes}-{max_nodes}" if max_nodes and max_nodes > nodes else nodes)
    put("ntasks", _number(job.get("tasks")))
    put("ntasks-per-node", _number(job.get("tasks_per_node")) or None)
    put("cpus-per-task", _number(job.get("cpus_per_task")))
    memory_per_node = _number(job.get("memory_per_node"))
    memory_per_cpu = _number(job.get("memory_per_cpu"))
    if memory_per_node:
        put("mem", f"{memory_per_node}M")
    elif memory_per_cpu:
        put("mem-per-cpu", f"{memory_per_cpu}M")
    limit = _number(job.get("time_limit"))
    # A year is the backfill's stand-in for none (parse.time_limit_s): a target partition
    # whose MaxTime is shorter would refuse the job for it. (A limit of a year or more that
    # a user asked for is dropped too: Slurm's record cannot tell the two apart.)
    put("time", limit if limit is not None and limit < YEAR_MINUTES else None)
    put("time-min", _number(job.get("time_minimum")) or None)
    gres = ",".join(
        item.strip().removeprefix("gres:").removeprefix("gres/")
        for item in _text(job, "tres_per_node").split(",")
        if item.strip()
    )
    put("gres", gres)
    put("gpus", _tres_gpus(_text(job, "tres_per_job")))
    put("gpus-per-task", _tres_gpus(_text(job, "tres_per_task")))
    put("cpus-per-gpu", _tres_number(_text(job, "cpus_per_tres")))
    memory_per_gpu = _tres_number(_text(job, "memory_per_tres"))
    put("mem-per-gpu", f"{memory_per_gpu}M" if memory_per_gpu else None)
    put("constraint", _text(job, "features"))
    put("licenses", _text(job, "licenses"))
    if job.get("contiguous") is True:
        options["contiguous"] = True
    if job.get("requeue") is True:
        options["requeue"] = True
    elif job.get("requeue") is False:
        options["no-requeue"] = True
    return options


def submit_spec(*, script: str, options: dict[str, OptionValue], user: str) -> SubmitSpec:
    """The spec a pending or running job carries in telemetry (see the module docstring)."""
    native: dict[str, Any] = {"script": script, "options": options}
    workdir = options.get("chdir")
    if isinstance(workdir, str):
        native["workdir"] = workdir
    if user:
        native["user"] = user
    return SubmitSpec(scheduler=SchedulerKind.slurm, native=native)


# --- the target side: a spec → sbatch ----------------------------------------------------------


@dataclass(frozen=True)
class SbatchRequest:
    """An sbatch to run: ``args`` after ``sbatch --parsable``, the script for its stdin,
    the environment it runs in (its job inherits it) and the user the job runs as."""

    args: list[str]
    script: str
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None


@dataclass(frozen=True)
class TargetCluster:
    """What the target's sbatch needs to know of the cluster it submits to."""

    name: str
    partitions: tuple[str, ...]
    default_partition: str | None
    portable_workdir: str
    # Who runs jobs from a portable form, which names no user (None: nobody set one).
    portable_user: str | None = None


def move_comment(comment: str, name: str) -> str:
    """The job's comment with this move's mark instead of an earlier move's."""
    words = [word for word in comment.split() if not word.startswith(MOVE_MARK)]
    return " ".join([*words, f"{MOVE_MARK}{name}"])


# What squeue's ``%T`` prints for a job that has ended, or is ending and holds nothing it
# could still start with: terminal states, and the flags of a job being cleaned up after
# its end (connectors.slurm.parse reports those as still running: they hold resources).
# A withdraw leaves these alone; every other state (pending, held, running, suspended,
# requeued, and any Slurm adds later) is a job that may still run, and is cancelled.
ENDED_STATES = TERMINAL_STATES | frozenset({"COMPLETING", "STAGE_OUT"})


def _oldest(job_ids: list[str]) -> list[str]:
    """Job ids oldest first (ids are counters: a shorter one is older)."""
    return sorted(job_ids, key=lambda job_id: (len(job_id), job_id))


def moved_job(squeue_lines: str, name: str) -> str | None:
    """The id of the job submitted for move ``name``, in any state, from
    ``squeue -o '%i|%k'`` lines."""
    mark = f"{MOVE_MARK}{name}"
    found = []
    for line in squeue_lines.splitlines():
        job_id, _, comment = line.partition("|")
        if mark in comment.split():
            found.append(job_id.strip())
    # Two would be a bug elsewhere; the oldest is the one a first delivery submitted.
    return _oldest(found)[0] if found else None


def ran_moved_jobs(squeue_lines: str, name: str) -> list[tuple[str, str]]:
    """``(id, state)`` of the jobs submitted for move ``name`` that ran here and ended
    (connectors.slurm.arrival.ran_here, the rule the move's confirm applies too: CANCELLED
    after running too, unless by the move's own withdraw), oldest first, from
    ``squeue -o LISTED_FORMAT`` lines. A copy the confirm rejected is never among them."""
    found = {job.job_id: job.state for job in _of_move(squeue_lines, name) if ran_here(job)}
    return [(job_id, found[job_id]) for job_id in _oldest(list(found))]


def withdrawn_moved_jobs(squeue_lines: str, name: str) -> list[str]:
    """The ids of the jobs of move ``name`` that its withdraw stamped to cancel
    (connectors.slurm.arrival.withdrawn), ended or ending, oldest first: a resent withdraw
    answers with them as the first did."""
    found = [
        job.job_id
        for job in _of_move(squeue_lines, name)
        if withdrawn(job) and job.state in ENDED_STATES
    ]
    return _oldest(found)


def withdrawn_comment(comment: str, name: str) -> str:
    """The job's comment with the mark of move ``name``'s withdraw added (once)."""
    mark = f"{WITHDRAWN_MARK}{name}"
    words = comment.split()
    return " ".join(words if mark in words else [*words, mark])


def live_moved_jobs(squeue_lines: str, name: str) -> list[str]:
    """The ids of the jobs submitted for move ``name`` that have not ended (not in
    :data:`ENDED_STATES`), oldest first, from ``squeue -o LISTED_FORMAT`` lines."""
    live = [job.job_id for job in _of_move(squeue_lines, name) if job.state not in ENDED_STATES]
    return _oldest(live)


def _of_move(squeue_lines: str, name: str) -> list[ListedJob]:
    mark = f"{MOVE_MARK}{name}"
    return [job for job in parse_listed(squeue_lines) if mark in job.comment.split()]


def switch_off_source_directives(script: str) -> str:
    """Turn the script's ``#SBATCH`` lines that name the source cluster's things into
    comments (sbatch reads directives only up to the first command, so only that head)."""
    lines = script.splitlines(keepends=True)
    for index, line in enumerate(lines):
        stripped = line.strip()
        if index > 0 and stripped and not stripped.startswith("#"):
            break
        directive = _DIRECTIVE.match(line)
        if directive and directive.group(1) in _SOURCE_BOUND:
            lines[index] = SWITCHED_OFF + line[len("#SBATCH") :]
    return "".join(lines)


def sbatch_request(
    spec: SubmitSpec,
    *,
    name: str,
    target: TargetCluster,
    home_of: Callable[[str], str | None],
    nodes: list[str] | None = None,
    hold: bool = False,
) -> SbatchRequest:
    """The sbatch that submits ``spec`` to ``target`` as move ``name``.

    ``home_of``: a user's home directory (None: unknown), for the job's clean environment.
    ``nodes``: pin the job to these nodes of the target (``--nodelist``; None or empty: no
    pin). It wins over any node list of the source's: the spec cannot carry one and the
    script's are switched off. Slurm reads a node list as the nodes the job must include,
    so a job of more nodes than named gets others too: a move names all its nodes.
    ``hold``: submit it held (``--hold``), to wait for a ``release``. A spec of another
    scheduler runs only through its portable form; one that Slurm cannot run raises a
    non-retryable :class:`ConnectorError` saying why."""
    check_move_name(name)
    pin = _pin(nodes, what=f"submit {name} to {target.name}")
    if spec.scheduler is SchedulerKind.slurm:
        request = _native_request(spec.native, name=name, target=target, home_of=home_of)
    elif spec.portable is None:
        raise ConnectorError(
            f"submit {name}: a {spec.scheduler.value} job cannot run on Slurm cluster "
            f"{target.name}: its spec has no portable form (a command with its resources), "
            f"and a {spec.scheduler.value} spec's native form means nothing to Slurm",
            retryable=False,
        )
    else:
        request = _portable_request(spec.portable, name=name, target=target)
    extra = [*([f"--nodelist={pin}"] if pin else []), *(["--hold"] if hold else [])]
    if not extra:
        return request
    return SbatchRequest(
        args=[*request.args, *extra],
        script=request.script,
        env=request.env,
        user=request.user,
    )


def _pin(nodes: list[str] | None, *, what: str) -> str:
    """``--nodelist``'s value for ``nodes`` ("" when none): each one node's name."""
    if not nodes:
        return ""
    bad = [node for node in nodes if not isinstance(node, str) or not _NODE_NAME.match(node)]
    if bad:
        raise ConnectorError(
            f"{what}: cannot pin the job to {bad}: a node to pin to is one node's name "
            "(letters, digits and ._-)",
            retryable=False,
        )
    return ",".join(dict.fromkeys(nodes))


def _native_request(
    native: dict[str, Any],
    *,
    name: str,
    target: TargetCluster,
    home_of: Callable[[str], str | None],
) -> SbatchRequest:
    what = f"submit {name} to {target.name}"
    script = native.get("script")
    if not isinstance(script, str) or not script.startswith("#!"):
        raise ConnectorError(
            f"{what}: native.script must be a batch script starting with '#!'", retryable=False
        )
    raw_options = native.get("options", {})
    if not isinstance(raw_options, dict):
        raise ConnectorError(f"{what}: native.options must be an object", retryable=False)
    options = _checked_options(raw_options, what=what)
    options["partition"] = _partition(options.get("partition"), target, what=what)
    options["comment"] = move_comment(str(options.get("comment", "")), name)
    user = native.get("user")
    if user is not None and (not isinstance(user, str) or not _USER_NAME.match(user)):
        raise ConnectorError(f"{what}: native.user {user!r} is not a user name", retryable=False)
    env = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8"}
    if user:
        env.update({"USER": user, "LOGNAME": user})
        home = home_of(user)
        if home:
            env["HOME"] = home
    return SbatchRequest(
        args=_arguments(options),
        script=switch_off_source_directives(script),
        env=env,
        user=user or None,
    )


def _checked_options(raw: dict[str, Any], *, what: str) -> dict[str, OptionValue]:
    unknown = sorted(set(raw) - ALLOWED_OPTIONS)
    if unknown:
        raise ConnectorError(
            f"{what}: native.options {unknown} are not options a moved job may carry "
            f"(allowed: {', '.join(sorted(ALLOWED_OPTIONS))})",
            retryable=False,
        )
    options: dict[str, OptionValue] = {}
    for option, value in raw.items():
        if option in _FLAGS:
            if value is not True:
                raise ConnectorError(
                    f"{what}: native.options.{option} is a flag: true, got {value!r}",
                    retryable=False,
                )
            options[option] = True
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConnectorError(
                f"{what}: native.options.{option} must be a string, got {value!r}",
                retryable=False,
            )
        text = str(value)
        if not text or len(text) > MAX_OPTION_LENGTH or any(c in text for c in "\n\r\0"):
            raise ConnectorError(
                f"{what}: native.options.{option} must be one non-empty line of at most "
                f"{MAX_OPTION_LENGTH} characters",
                retryable=False,
            )
        options[option] = text
    return options


def _partition(wanted: OptionValue | None, target: TargetCluster, *, what: str) -> str:
    """The job's partitions that the target has; else the target's default partition,
    named explicitly so that a ``#SBATCH --partition`` line of the source's cannot win."""
    names = [p for p in str(wanted or "").split(",") if p] if isinstance(wanted, str) else []
    kept = [p for p in names if p in target.partitions]
    if kept:
        return ",".join(kept)
    if target.default_partition is None:
        raise ConnectorError(
            f"{what}: none of the job's partitions ({','.join(names) or 'none named'}) exist "
            f"on {target.name}, and it has no default partition "
            f"(it has {', '.join(target.partitions) or 'none'})",
            retryable=False,
        )
    return target.default_partition


def _arguments(options: dict[str, OptionValue]) -> list[str]:
    return [
        f"--{option}" if value is True else f"--{option}={value}"
        for option, value in sorted(options.items())
    ]


def _portable_request(portable: PortableSpec, *, name: str, target: TargetCluster) -> SbatchRequest:
    what = f"submit {name} to {target.name}"
    if portable.image:
        raise ConnectorError(
            f"{what}: the portable form needs the container image {portable.image!r}, and "
            "this Slurm connector runs no containers (only a command in an environment)",
            retryable=False,
        )
    if not portable.command:
        raise ConnectorError(f"{what}: the portable form has no command", retryable=False)
    bad = sorted(key for key in portable.env if not _ENV_NAME.match(key))
    if bad:
        raise ConnectorError(
            f"{what}: portable.env names {bad} are not environment variable names",
            retryable=False,
        )
    script = (
        "#!/bin/sh\n# Submitted by Shaper from a portable job spec.\n"
        f"exec {shlex.join(portable.command)}\n"
    )
    options: dict[str, OptionValue] = {
        "job-name": name,
        "comment": move_comment("", name),
        "chdir": target.portable_workdir,
        "nodes": "1",
        "ntasks": "1",
        "partition": _partition(None, target, what=what),
    }
    if portable.gpus:
        options["gres"] = f"gpu:{portable.gpus}"
    if portable.cpus:
        options["cpus-per-task"] = str(math.ceil(portable.cpus))
    if portable.memory_mib:
        options["mem"] = f"{portable.memory_mib}M"
    env = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8", **portable.env}
    user = target.portable_user
    if user:
        env.update({"USER": user, "LOGNAME": user})
    return SbatchRequest(args=_arguments(options), script=script, env=env, user=user)


def submitted_id(output: str, *, what: str) -> str:
    """The job id of ``sbatch --parsable`` (``"123"`` or ``"123;cluster"``)."""
    job_id = output.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise ConnectorError(f"{what}: sbatch printed no job id: {output!r}", retryable=False)
    return job_id
