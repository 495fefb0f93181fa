from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.core.errors import Conflict, Invalid, NotFound
from app.core.lookup import found, not_taken
from app.gpu_models import service as gpu_model_service
from app.policies.models import (
    SlaPolicy,
    SlaPolicyCreate,
    SlaPolicySpec,
    SlaPolicyUpdate,
    spec_field,
)


def create_policy(
    *,
    session: Session,
    policy_in: SlaPolicyCreate,
    by: str,
    now: datetime,
    actor: Actor | None = None,
) -> SlaPolicy:
    check_models(session, policy_in.spec)
    before = _latest(session, policy_in.name)
    not_taken(
        before if before is not None and not before.deleted else None,
        f"SLA policy {policy_in.name!r} exists; PUT a new version instead",
        resource="sla_policy",
        resource_id=policy_in.name,
    )
    policy = SlaPolicy(
        name=policy_in.name,
        # A deleted name created again continues its history rather than rewriting it.
        version=before.version + 1 if before is not None else 1,
        spec=policy_in.spec.model_dump(mode="json"),
        comment=policy_in.comment,
        created_at=now,
        created_by=by,
    )
    session.add(policy)
    _record(session, actor, "create", policy, now, teams=[], services=[])
    _commit(session, policy_in.name)
    session.refresh(policy)
    return policy


def new_version(
    *,
    session: Session,
    name: str,
    policy_in: SlaPolicyUpdate,
    by: str,
    now: datetime,
    actor: Actor | None = None,
    verb: str = "update",
) -> SlaPolicy:
    """``verb`` names the change in the audit log (``import``: from a YAML document)."""
    latest = get_policy(session=session, name=name)
    check_models(session, policy_in.spec)
    spec = policy_in.spec.model_dump(mode="json")
    return _append(session, latest, spec, policy_in.comment, by=by, now=now, actor=actor, verb=verb)


def _append(
    session: Session,
    latest: SlaPolicy,
    spec: dict[str, Any],
    comment: str,
    *,
    by: str,
    now: datetime,
    actor: Actor | None,
    verb: str,
    **audited: Any,
) -> SlaPolicy:
    """Write the version after ``latest`` with ``spec``, audited as ``verb`` (history only
    grows: an edit, an import and a rollback each append one)."""
    policy = SlaPolicy(
        name=latest.name,
        version=latest.version + 1,
        spec=spec,
        comment=comment,
        created_at=now,
        created_by=by,
    )
    session.add(policy)
    _record(
        session,
        actor,
        verb,
        policy,
        now,
        teams=_names(latest.spec, "teams", "team"),
        services=_names(latest.spec, "services", "service"),
        **audited,
    )
    _commit(session, latest.name)
    session.refresh(policy)
    return policy


def roll_back(
    *,
    session: Session,
    name: str,
    version: int,
    comment: str,
    by: str,
    now: datetime,
    actor: Actor | None = None,
) -> SlaPolicy:
    """Append a version whose spec is ``version``'s: history only grows, so the rollback
    is itself a version that can be rolled back. The current version must exist (a
    deleted policy is brought back by POST); the target must not be the deletion itself,
    nor already the current terms."""
    latest = get_policy(session=session, name=name)
    target = get_policy(session=session, name=name, version=version)
    if target.deleted:
        raise Invalid(
            f"version: version {version} of SLA policy {name!r} is its deletion; roll back "
            "to a version before it",
            field="version",
            resource="sla_policy",
            resource_id=name,
        )
    if same_terms(latest.spec, target.spec):
        raise Conflict(
            f"SLA policy {name!r} version {latest.version} has the terms of version "
            f"{version} already; nothing to roll back",
            resource="sla_policy",
            resource_id=name,
        )
    return _append(
        session,
        latest,
        _valid_today(target),
        comment or f"rolled back to version {version}",
        by=by,
        now=now,
        actor=actor,
        verb="rollback",
        rolled_back_to=version,
    )


def check_models(session: Session, spec: SlaPolicySpec) -> None:
    """Every GPU model a speed profile names is in the catalogue, spelt as it spells it
    (a stored spec is compared as written with the next import of the same document, so
    it is not respelt: a GitOps sync of ``h100`` would write a version each time)."""
    catalogue = set(gpu_model_service.ids_by_name(session=session))
    spelling = gpu_model_service.by_case(catalogue)
    for index, profile in enumerate(spec.speed_profiles):
        for model in profile.speeds:
            if model in catalogue:
                continue
            known = spelling.get(model.lower())
            hint = f" (the catalogue spells it {known!r})" if known else ""
            raise Invalid(
                f"unknown GPU model {model!r}{hint}: a speed profile names catalogue models "
                "(GET /api/v1/gpu-models)",
                field=f"spec.speed_profiles[{index}].speeds.{model}",
            )


def _valid_today(target: SlaPolicy) -> dict[str, Any]:
    """``target``'s spec as a version written today stores it. A version written under an
    older schema may state terms today's model refuses (a field since removed, a bound
    since tightened): rolling back to it must not store what no PUT could."""
    try:
        return SlaPolicySpec.model_validate(target.spec).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = spec_field(list(first["loc"]))
        raise Invalid(
            f"version: version {target.version} of SLA policy {target.name!r} states terms "
            f"that are not valid today ({where}: {first['msg']}); PUT corrected terms instead",
            field="version",
            resource="sla_policy",
            resource_id=target.name,
        ) from None


def apply_spec(
    *,
    session: Session,
    name: str,
    spec: SlaPolicySpec,
    comment: str,
    by: str,
    now: datetime,
    actor: Actor | None = None,
) -> tuple[SlaPolicy, bool]:
    """An edit that is a no-op when the terms are the current ones (GitOps applies the
    same file on every sync; each would otherwise be a version). Returns the current
    version and whether this call wrote it."""
    latest = get_policy(session=session, name=name)
    if same_terms(latest.spec, spec.model_dump(mode="json")):
        return latest, False
    policy_in = SlaPolicyUpdate(spec=spec, comment=comment)
    return (
        new_version(
            session=session,
            name=name,
            policy_in=policy_in,
            by=by,
            now=now,
            actor=actor,
            verb="import",
        ),
        True,
    )


def same_terms(stored: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two specs say the same once defaults are filled in: a version written
    before a field existed lacks it, and that is not a difference in terms."""
    return comparable(stored) == comparable(other)


def comparable(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with every default filled in, as a version written today stores it; one
    no current model reads (an older schema) as it is."""
    try:
        return SlaPolicySpec.model_validate(spec).model_dump(mode="json")
    except ValidationError:
        return spec


def delete_policy(
    *, session: Session, name: str, by: str, now: datetime, actor: Actor | None = None
) -> SlaPolicy:
    """Append a ``deleted`` version (the last spec kept, for the record): the policy no
    longer applies to any cycle and leaves the list; its versions stay readable."""
    latest = get_policy(session=session, name=name)
    tombstone = SlaPolicy(
        name=name,
        version=latest.version + 1,
        spec=latest.spec,
        comment="deleted",
        deleted=True,
        created_at=now,
        created_by=by,
    )
    session.add(tombstone)
    _record(
        session,
        actor,
        "delete",
        tombstone,
        now,
        teams=_names(latest.spec, "teams", "team"),
        services=_names(latest.spec, "services", "service"),
        after_empty=True,
    )
    _commit(session, name)
    session.refresh(tombstone)
    return tombstone


def _commit(session: Session, name: str) -> None:
    """Commit a new version; the (name, version) unique constraint refuses a concurrent
    twin (two edits, an edit and a delete, two creations read the same latest version):
    the later one is a 409 to read the policy again, not a 500."""
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(
            f"SLA policy {name!r} changed while this request was handled; read it and retry",
            resource="sla_policy",
            resource_id=name,
        ) from None


def _latest(session: Session, name: str) -> SlaPolicy | None:
    return session.exec(
        select(SlaPolicy).where(SlaPolicy.name == name).order_by(col(SlaPolicy.version).desc())
    ).first()


def _names(spec: dict[str, Any], section: str, key: str) -> list[str]:
    return sorted(str(entry.get(key)) for entry in spec.get(section, []))


def _record(
    session: Session,
    actor: Actor | None,
    verb: str,
    policy: SlaPolicy,
    now: datetime,
    *,
    teams: list[str],
    services: list[str],
    after_empty: bool = False,
    rolled_back_to: int | None = None,
) -> None:
    """The new version, and which teams and services it names before and after (the
    specs themselves stay readable as versions); after a delete it names none."""
    after: dict[str, list[str]] = {
        "teams": [] if after_empty else _names(policy.spec, "teams", "team"),
        "services": [] if after_empty else _names(policy.spec, "services", "service"),
    }
    audit.record(
        session=session,
        actor=actor,
        verb=verb,
        object_type=AuditObject.sla_policy,
        object_id=policy.name,
        now=now,
        changes={
            "version": [policy.version - 1 or None, policy.version],
            "comment": policy.comment,
            **({} if rolled_back_to is None else {"rolled_back_to": rolled_back_to}),
            **audit.diff({"teams": teams, "services": services}, after),
        },
    )


def get_policy(*, session: Session, name: str, version: int | None = None) -> SlaPolicy:
    """One version, or the current one; a deleted policy has no current version (404
    saying so), though each of its versions, the deletion included, stays readable."""
    query = select(SlaPolicy).where(SlaPolicy.name == name)
    query = (
        query.where(SlaPolicy.version == version)
        if version is not None
        else query.order_by(col(SlaPolicy.version).desc())
    )
    what = f"SLA policy {name!r}" + (f" version {version}" if version else "")
    policy = found(
        session.exec(query).first(),
        f"{what} does not exist",
        resource="sla_policy",
        resource_id=name,
    )
    if version is None and policy.deleted:
        raise NotFound(
            f"SLA policy {name!r} was deleted (version {policy.version}); its versions "
            "stay readable",
            resource="sla_policy",
            resource_id=name,
        )
    return policy


def list_latest(*, session: Session) -> list[SlaPolicy]:
    latest = (
        sa.select(col(SlaPolicy.name), sa.func.max(SlaPolicy.version).label("version"))
        .group_by(col(SlaPolicy.name))
        .subquery()
    )
    query = (
        select(SlaPolicy)
        .join(
            latest,
            sa.and_(
                col(SlaPolicy.name) == latest.c.name, col(SlaPolicy.version) == latest.c.version
            ),
        )
        .where(col(SlaPolicy.deleted).is_(False))
        .order_by(SlaPolicy.name)
    )
    return list(session.exec(query))


def list_versions(*, session: Session, name: str) -> list[SlaPolicy]:
    versions = list(
        session.exec(
            select(SlaPolicy).where(SlaPolicy.name == name).order_by(col(SlaPolicy.version))
        )
    )
    if not versions:
        raise NotFound(
            f"SLA policy {name!r} does not exist", resource="sla_policy", resource_id=name
        )
    return versions
