from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.gpu_models import service
from app.gpu_models.models import GpuModelCreate, GpuModelPublic

router = APIRouter(prefix="/gpu-models", tags=["gpu-models"])


@router.get("", **scoped("viewer"))
def list_gpu_models(session: SessionDep) -> list[GpuModelPublic]:
    return [GpuModelPublic.model_validate(m) for m in service.list_gpu_models(session=session)]


@router.post(
    "",
    status_code=201,
    responses={409: {"description": "A model of that name is in the catalogue"}},
    **scoped("admin"),
)
def create_gpu_model(
    session: SessionDep, clock: ClockDep, actor: ActorDep, model_in: GpuModelCreate
) -> GpuModelPublic:
    return GpuModelPublic.model_validate(
        service.create_gpu_model(session=session, model_in=model_in, now=clock.now(), actor=actor)
    )


@router.get("/{name}", **scoped("viewer"))
def get_gpu_model(session: SessionDep, name: str) -> GpuModelPublic:
    return GpuModelPublic.model_validate(service.get_gpu_model(session=session, name=name))
