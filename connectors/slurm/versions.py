"""Slurm's JSON of Slurm 23.11 and later (data_parser v0.0.40–v0.0.42), read as the
v0.0.38 records of Slurm 22.05 that :mod:`connectors.slurm.parse` is written against.

Measured on Slurm 24.11.5 (``scripts/slurm-build.sh``; its ``squeue --json``, ``scontrol
show nodes --json`` and slurmrestd's v0.0.40, v0.0.41 and v0.0.42), what changed for the
fields the connector reads:

* a response names its version in ``meta.plugin.data_parser`` (``data_parser/v0.0.42``);
  ``meta.plugin.type`` is ``openapi/slurmctld`` from slurmrestd and empty from the CLI;
* a job's ``job_state`` is a list, its base state and then its flags (``["PENDING",
  "REQUEUED"]``), where 22.05 printed one word, a flag's name before the base state's
  (``job_state_string``: :data:`_FLAG_ORDER`);
* numbers Slurm may leave unset are ``{"set": bool, "infinite": bool, "number": int}``
  (``node_count``, ``max_nodes``, ``tasks``, ``priority``, times, limits…);
* a node's ``state`` is a list, base state and flags (``["IDLE", "DRAIN"]``), where 22.05
  gave a lower-case base ``state`` and a ``state_flags`` list; its ``features`` and
  ``active_features`` are lists, not comma-separated strings;
* Slurm 23.02 and later print other shapes from ``sinfo --json`` (one entry per node and
  partition group), so the CLI reads nodes with ``scontrol show nodes --json`` there, and
  one job with ``scontrol show job ID --json`` (22.05's ``squeue --json`` lists every job
  whatever ``-j`` says, and its ``scontrol`` has no ``--json``).
"""

from __future__ import annotations

from typing import Any

Document = dict[str, Any]

# The versions Slurm 23.11-24.11 answer in (24.11 speaks v0.0.40, v0.0.41 and v0.0.42).
DATA_PARSER_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")

# job_state_string() of Slurm (src/common/slurm_protocol_defs.c): the first of these flags
# a job has is the word 22.05 printed; else its base state.
_FLAG_ORDER = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
_NODE_BASE_STATES = frozenset(
    {"INVALID", "UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"}
)
# What 22.05 printed for INFINITE in a plain number (time limits): the parsers read it.
_INFINITE = 0xFFFFFFFF


def is_data_parser(version: str) -> bool:
    return version in DATA_PARSER_VERSIONS


def legacy_job_state(states: Any) -> str:
    """``["PENDING", "REQUEUED"]`` → ``"REQUEUED"``: the one word 22.05 printed."""
    if isinstance(states, str):
        return states
    names = [str(state).upper() for state in states or []]
    for flag in _FLAG_ORDER:
        if flag in names:
            return flag
    return names[0] if names else ""


def _number(value: Any) -> Any:
    """``{"set": true, "number": 3}`` → 3; unset → None; infinite → Slurm's INFINITE;
    anything else as it is."""
    if not isinstance(value, dict) or "number" not in value:
        return value
    if value.get("infinite"):  # Slurm 24.11 sends an unlimited time limit as unset and infinite
        return _INFINITE
    if not value.get("set", True):
        return None
    return value.get("number")


def legacy_job(job: Document) -> Document:
    """A v0.0.40+ job record with the v0.0.38 shapes of the fields the parser reads."""
    legacy = {key: _number(value) for key, value in job.items()}
    legacy["job_state"] = legacy_job_state(job.get("job_state"))
    return legacy


def legacy_node(node: Document) -> Document:
    """A v0.0.40+ node record with 22.05's ``state``/``state_flags`` and comma-separated
    features."""
    legacy = {key: _number(value) for key, value in node.items()}
    states = node.get("state")
    if isinstance(states, list):
        names = [str(state).upper() for state in states]
        base = next((name for name in names if name in _NODE_BASE_STATES), "UNKNOWN")
        legacy["state"] = base.lower()
        legacy["state_flags"] = [name for name in names if name != base]
    for key in ("features", "active_features"):
        if isinstance(node.get(key), list):
            legacy[key] = ",".join(str(feature) for feature in node[key])
    return legacy
