from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, select

from app.core.errors import Conflict, NotFound
from app.policies.models import SlaPolicy, SlaPolicyCreate, SlaPolicyUpdate


def create_policy(
    *, session: Session, policy_in: SlaPolicyCreate, by: str, now: datetime
) -> SlaPolicy:
    if session.exec(select(SlaPolicy).where(SlaPolicy.name == policy_in.name)).first():
        raise Conflict(
            f"SLA policy {policy_in.name!r} exists; PUT a new version instead",
            field="name",
            resource="sla_policy",
            resource_id=policy_in.name,
        )
    policy = SlaPolicy(
        name=policy_in.name,
        version=1,
        spec=policy_in.spec.model_dump(mode="json"),
        comment=policy_in.comment,
        created_at=now,
        created_by=by,
    )
    session.add(policy)
    session.commit()
    session.refresh(policy)
    return policy


def new_version(
    *, session: Session, name: str, policy_in: SlaPolicyUpdate, by: str, now: datetime
) -> SlaPolicy:
    latest = get_policy(session=session, name=name)
    policy = SlaPolicy(
        name=name,
        version=latest.version + 1,
        spec=policy_in.spec.model_dump(mode="json"),
        comment=policy_in.comment,
        created_at=now,
        created_by=by,
    )
    session.add(policy)
    session.commit()  # the (name, version) unique constraint refuses a concurrent twin
    session.refresh(policy)
    return policy


def get_policy(*, session: Session, name: str, version: int | None = None) -> SlaPolicy:
    query = select(SlaPolicy).where(SlaPolicy.name == name)
    query = (
        query.where(SlaPolicy.version == version)
        if version is not None
        else query.order_by(SlaPolicy.version.desc())
    )  # type: ignore[attr-defined]
    policy = session.exec(query).first()
    if policy is None:
        what = f"SLA policy {name!r}" + (f" version {version}" if version else "")
        raise NotFound(f"{what} does not exist", resource="sla_policy", resource_id=name)
    return policy


def list_latest(*, session: Session) -> list[SlaPolicy]:
    latest = (
        sa.select(SlaPolicy.name, sa.func.max(SlaPolicy.version).label("version"))
        .group_by(SlaPolicy.name)
        .subquery()
    )
    query = (
        select(SlaPolicy)
        .join(
            latest, sa.and_(SlaPolicy.name == latest.c.name, SlaPolicy.version == latest.c.version)
        )
        .order_by(SlaPolicy.name)
    )
    return list(session.exec(query))


def list_versions(*, session: Session, name: str) -> list[SlaPolicy]:
    versions = list(
        session.exec(
            select(SlaPolicy).where(SlaPolicy.name == name).order_by(SlaPolicy.version)  # type: ignore[arg-type]
        )
    )
    if not versions:
        raise NotFound(
            f"SLA policy {name!r} does not exist", resource="sla_policy", resource_id=name
        )
    return versions
