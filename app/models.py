"""Every table, imported once so ``SQLModel.metadata`` is complete (Alembic, tests)."""

from sqlmodel import SQLModel

from app.actions.models import Action
from app.audit.models import AuditRecord
from app.clusters.models import Cluster
from app.federation.models import FederationGroup
from app.forecasts.models import RuntimePrediction, ServiceForecast
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.plans.models import Plan
from app.policies.models import SlaPolicy
from app.telemetry.models import TelemetrySample
from app.tokens.models import ApiToken
from app.utilization.models import UtilizationRollup, UtilizationRollupDelta

metadata = SQLModel.metadata

__all__ = [
    "Action",
    "Allocation",
    "ApiToken",
    "AuditRecord",
    "Cluster",
    "FederationGroup",
    "GpuModel",
    "Job",
    "Node",
    "Plan",
    "RuntimePrediction",
    "ServiceForecast",
    "SlaPolicy",
    "TelemetrySample",
    "UtilizationRollup",
    "UtilizationRollupDelta",
    "metadata",
]
