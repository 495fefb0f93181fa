"""Kueue connector: the Kubernetes connector plus Kueue's Workloads, queues and flavors.
Importing it registers the kind (and the Kubernetes one, which it builds on)."""

import connectors.kubernetes  # noqa: F401  (registers kubernetes; the base of this kind)
from connectors.kueue.connector import KueueConnector, create_kueue_connector
from connectors.registry import register
from wire.telemetry import SchedulerKind

register(SchedulerKind.kueue, create_kueue_connector)

__all__ = ["KueueConnector", "create_kueue_connector"]
