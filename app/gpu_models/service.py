"""The GPU model catalogue: memory, precisions and relative speed per model."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlmodel import Session, select

from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.core.lookup import found, not_taken
from app.gpu_models.models import GpuModel, GpuModelCreate

# Public datasheet figures; relative_speed is dense BF16 throughput relative to A100
# (a planning weight, not a benchmark claim). Sites override or add models via the API.
DEFAULT_CATALOGUE: tuple[GpuModelCreate, ...] = tuple(
    GpuModelCreate.model_validate(entry)
    for entry in (
        {"name": "H200", "memory_gib": 141, "relative_speed": 3.2,
         "precisions": ["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]},
        {"name": "H100", "memory_gib": 80, "relative_speed": 3.0,
         "precisions": ["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]},
        {"name": "L40S", "memory_gib": 48, "relative_speed": 1.2,
         "precisions": ["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]},
        {"name": "A100-80G", "memory_gib": 80, "relative_speed": 1.0,
         "precisions": ["fp64", "fp32", "tf32", "bf16", "fp16", "int8"]},
        {"name": "A100-40G", "memory_gib": 40, "relative_speed": 1.0,
         "precisions": ["fp64", "fp32", "tf32", "bf16", "fp16", "int8"]},
        {"name": "A10", "memory_gib": 24, "relative_speed": 0.4,
         "precisions": ["fp32", "tf32", "bf16", "fp16", "int8"]},
        {"name": "V100", "memory_gib": 32, "relative_speed": 0.4,
         "precisions": ["fp64", "fp32", "fp16"]},
        {"name": "T4", "memory_gib": 16, "relative_speed": 0.2,
         "precisions": ["fp32", "fp16", "int8"]},
        {"name": "P100", "memory_gib": 16, "relative_speed": 0.15,
         "precisions": ["fp64", "fp32", "fp16"]},
        {"name": "G2", "memory_gib": 32, "relative_speed": 0.5,
         "precisions": ["fp32", "fp16", "int8"]},
        {"name": "G3", "memory_gib": 32, "relative_speed": 0.6,
         "precisions": ["fp32", "fp16", "bf16", "int8"]},
    )
)  # fmt: skip


def list_gpu_models(*, session: Session) -> list[GpuModel]:
    return list(session.exec(select(GpuModel).order_by(GpuModel.name)))


def get_gpu_model(*, session: Session, name: str) -> GpuModel:
    model = session.exec(select(GpuModel).where(GpuModel.name == name)).first()
    return found(
        model, f"GPU model {name!r} is not in the catalogue", resource="gpu_model", resource_id=name
    )


def create_gpu_model(
    *, session: Session, model_in: GpuModelCreate, now: datetime, actor: Actor | None = None
) -> GpuModel:
    not_taken(
        session.exec(select(GpuModel).where(GpuModel.name == model_in.name)).first(),
        f"GPU model {model_in.name!r} already exists",
        resource="gpu_model",
        resource_id=model_in.name,
    )
    model = GpuModel(
        **model_in.model_dump(exclude={"precisions"}),
        precisions=[p.value for p in model_in.precisions],
    )
    session.add(model)
    audit.record(
        session=session,
        actor=actor,
        verb="create",
        object_type=AuditObject.gpu_model,
        object_id=model.name,
        now=now,
        changes=model_in.model_dump(),
    )
    session.commit()
    session.refresh(model)
    return model


def ensure_default_catalogue(*, session: Session) -> int:
    """Add the default models that are missing; never changes an existing one."""
    known = set(session.exec(select(GpuModel.name)))
    added = 0
    for model_in in DEFAULT_CATALOGUE:
        if model_in.name not in known:
            session.add(
                GpuModel(
                    **model_in.model_dump(exclude={"precisions"}),
                    precisions=[p.value for p in model_in.precisions],
                )
            )
            added += 1
    session.commit()
    return added


def ids_by_name(*, session: Session) -> dict[str, int]:
    return {name: id_ for id_, name in session.exec(select(GpuModel.id, GpuModel.name)) if id_}


def by_case(catalogue: Collection[str]) -> dict[str, str]:
    """Lower-case name → the catalogue's spelling, for names no other differs from in
    case alone."""
    spellings: dict[str, list[str]] = {}
    for name in catalogue:
        spellings.setdefault(name.lower(), []).append(name)
    return {lower: names[0] for lower, names in spellings.items() if len(names) == 1}
