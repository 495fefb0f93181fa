"""Draining a Ray node through its GCS (what ``ray drain-node`` and Ray's autoscaler do).

Ray's REST APIs neither drain a node nor say which nodes drain, so this part speaks to the
GCS with Ray's own client (``ray._raylet.GcsClient``, which the ``ray drain-node`` command
uses; Ray marks that command's interface as developer-facing, not stable). Ray is imported
here only (and in connectors.ray.gcs_jobs, through :func:`gcs_client`): reading telemetry
does not need it unless ``gcs_address`` is set. Nothing of Ray's leaves this module but
node ids (hex strings).

A drain with reason *preemption* is accepted even while work runs: Ray then places no new
work on the node, and what runs there goes on until it ends or the deadline passes (Ray
does not kill it at the deadline; whoever drains does). Shaper moves the work off first,
through its own plan's steps.
"""

from __future__ import annotations

import importlib
import socket
import time
from typing import Any

from connectors.base import ConnectorError

PROBE_TIMEOUT_S = 5.0


def _ray_module(name: str) -> Any:
    # Imported by name: Ray's compiled modules carry no type information for mypy.
    return importlib.import_module(name)


def gcs_client(address: str) -> Any:
    """Ray's GCS client (connectors.ray.gcs_jobs reads through it too)."""
    # Ray's client waits ~40 s for a GCS that does not answer: look first, briefly.
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConnectorError(f"gcs_address must be host:port, got {address!r}", retryable=False)
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        raise ConnectorError(
            f"the Ray GCS at {address} is unreachable ({error})", retryable=True
        ) from error
    try:
        client_class = _ray_module("ray._raylet").GcsClient
    except ImportError as error:  # pragma: no cover - ray is a dependency of the connector
        raise ConnectorError(
            f"draining needs the ray package (pip install 'ray[default]'): {error}",
            retryable=False,
        ) from error
    try:
        return client_class(address=address)
    except Exception as error:  # Ray raises its own errors for an unreachable GCS
        raise ConnectorError(
            f"the Ray GCS at {address} is unreachable: {error}", retryable=True
        ) from error


def drain(address: str, node_id: str, *, message: str, deadline_s: float | None) -> None:
    autoscaler_pb2 = _ray_module("ray.core.generated.autoscaler_pb2")
    deadline_ms = 0 if deadline_s is None else time.time_ns() // 1_000_000 + int(deadline_s * 1000)
    try:
        accepted, rejection = gcs_client(address).drain_node(
            node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            message,
            deadline_ms,
        )
    except ConnectorError:
        raise
    except Exception as error:
        raise ConnectorError(f"drain Ray node {node_id}: {error}", retryable=True) from error
    if not accepted:
        raise ConnectorError(f"Ray refused to drain node {node_id}: {rejection}", retryable=False)


def draining_nodes(address: str) -> frozenset[str]:
    """The ids of the live nodes the GCS reports draining."""
    gcs_pb2 = _ray_module("ray.core.generated.gcs_pb2")
    try:
        nodes = gcs_client(address).get_all_node_info()
    except ConnectorError:
        raise
    except Exception as error:
        raise ConnectorError(
            f"read Ray's nodes from the GCS at {address}: {error}", retryable=True
        ) from error
    draining = gcs_pb2.NodeSnapshot.State.Value("DRAINING")
    return frozenset(
        node_id.hex() for node_id, info in nodes.items() if info.state_snapshot.state == draining
    )
