"""Ray connector: telemetry from a Ray head's state, Jobs and Serve APIs; stop and
resubmit jobs, submit jobs moved from another Ray cluster (connectors.ray.submission says
what a Ray job's ``SubmitSpec.native`` holds), scale Serve deployments, drain nodes.
Importing it registers the kind."""

from connectors.ray.config import RayConnectorConfig
from connectors.ray.connector import RayConnector, create_ray_connector
from connectors.registry import register
from wire.telemetry import SchedulerKind

register(SchedulerKind.ray, create_ray_connector)

__all__ = ["RayConnector", "RayConnectorConfig", "create_ray_connector"]
