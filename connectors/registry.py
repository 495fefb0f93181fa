"""Explicit registry of connector kinds: ``register`` at import of each connector package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.base import Connector
from wire.telemetry import SchedulerKind

ConnectorFactory = Callable[..., Connector]
_factories: dict[SchedulerKind, ConnectorFactory] = {}


def register(kind: SchedulerKind, factory: ConnectorFactory) -> None:
    if kind in _factories and _factories[kind] is not factory:
        raise ValueError(f"connector kind {kind.value!r} is already registered")
    _factories[kind] = factory


def create(kind: SchedulerKind, **options: Any) -> Connector:
    try:
        factory = _factories[kind]
    except KeyError:
        known = ", ".join(sorted(k.value for k in _factories)) or "none"
        raise LookupError(
            f"no connector registered for kind {kind.value!r} (registered: {known})"
        ) from None
    return factory(**options)


def registered_kinds() -> list[SchedulerKind]:
    return sorted(_factories, key=lambda k: k.value)
