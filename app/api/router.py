"""Mounts every domain router under /api/v1, each behind the parameter net
(``app.api.params``)."""

from fastapi import APIRouter, Depends

from app.actions.router import router as actions
from app.api.params import refuse_unusable_parameters
from app.audit.router import router as audit
from app.clusters.router import router as clusters
from app.diagnosis.router import router as diagnosis
from app.federation.router import router as federation
from app.forecasts.router import router as forecasts
from app.gpu_models.router import router as gpu_models
from app.jobs.router import router as jobs
from app.nodes.router import router as nodes
from app.overview.router import router as overview
from app.plans.router import router as plans
from app.policies.router import router as policies
from app.simulations.router import router as simulations
from app.telemetry.router import router as telemetry
from app.tokens.router import router as tokens
from app.utilization.router import router as utilization

api_router = APIRouter(prefix="/api/v1")
for domain_router in (
    clusters,
    federation,
    telemetry,
    gpu_models,
    nodes,
    jobs,
    utilization,
    overview,
    diagnosis,
    forecasts,
    plans,
    actions,
    policies,
    simulations,
    tokens,
    audit,
):
    api_router.include_router(domain_router, dependencies=[Depends(refuse_unusable_parameters)])
