"""Kubernetes connector: list+watch telemetry of nodes, pods and their owners. Importing it
registers the kind. With Kueue installed, use the Kueue connector (connectors.kueue)."""

from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector, create_kubernetes_connector
from connectors.kubernetes.informer import Informer
from connectors.kubernetes.pods import OwnerRef, parse_external_id
from connectors.registry import register
from wire.telemetry import SchedulerKind

register(SchedulerKind.kubernetes, create_kubernetes_connector)

__all__ = [
    "Informer",
    "KubernetesConnector",
    "KubernetesConnectorConfig",
    "OwnerRef",
    "create_kubernetes_connector",
    "parse_external_id",
]
