"""Slurm connector (slurmrestd with JWT, or the CLI's JSON). Importing it registers the kind."""

from connectors.base import SupportsNodeCount
from connectors.registry import register
from connectors.slurm.config import MappingRule, SlurmConnectorConfig, SlurmMapping
from connectors.slurm.connector import SlurmConnector, create_slurm_connector
from wire.telemetry import SchedulerKind

register(SchedulerKind.slurm, create_slurm_connector)

__all__ = [
    "MappingRule",
    "SlurmConnector",
    "SlurmConnectorConfig",
    "SlurmMapping",
    "SupportsNodeCount",
    "create_slurm_connector",
]
