"""Armada connector (Armada's gRPC API through armada-client). Importing it registers the
kind."""

from connectors.armada.config import ArmadaConnectorConfig, ArmadaMapping, ExecutorNode, JobSetRef
from connectors.armada.connector import ArmadaConnector, create_armada_connector
from connectors.armada.submission import NewJob
from connectors.registry import register
from wire.telemetry import SchedulerKind

register(SchedulerKind.armada, create_armada_connector)

__all__ = [
    "ArmadaConnector",
    "ArmadaConnectorConfig",
    "ArmadaMapping",
    "ExecutorNode",
    "JobSetRef",
    "NewJob",
    "create_armada_connector",
]
