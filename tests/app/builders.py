"""Builders for API payloads: valid by default, overridable field by field."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tests.conftest import T0


def node(name: str = "n1", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpu_model": "H100",
        "gpu_count": 8,
        "cpu_cores": 128,
        "memory_mib": 1_048_576,
        "labels": {"rack": "r1"},
        "state": "up",
        **fields,
    }


def job(external_id: str = "j1", **fields: Any) -> dict[str, Any]:
    return {
        "external_id": external_id,
        "name": external_id,
        "team": "vision",
        "queue": "default",
        "kind": "training",
        "priority": 10,
        "gpus_requested": 2,
        "state": "pending",
        "submit_time": T0.isoformat(),
        **fields,
    }


def running(external_id: str, node_name: str, indices: list[int], **fields: Any) -> dict[str, Any]:
    return job(
        external_id,
        state="running",
        start_time=T0.isoformat(),
        gpus_requested=len(indices),
        allocations=[{"node": node_name, "gpu_indices": indices}],
        **fields,
    )


def snapshot(
    seq: int,
    *,
    session: str = "s1",
    nodes: list[dict[str, Any]] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    samples: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "kind": "snapshot",
        "connector_session": session,
        "seq": seq,
        "nodes": nodes if nodes is not None else [node("n1"), node("n2")],
        "jobs": jobs or [],
        "samples": samples or [],
    }


def delta(seq: int, *, session: str = "s1", **fields: Any) -> dict[str, Any]:
    return {"kind": "delta", "connector_session": session, "seq": seq, **fields}


def util_sample(node_name: str, at: datetime, value: float) -> dict[str, Any]:
    return {"at": at.isoformat(), "metric": "gpu_util", "node": node_name, "value": value}
