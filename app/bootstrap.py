"""What every process does before serving: migrate the schema, seed the GPU catalogue."""

from __future__ import annotations

from sqlmodel import Session

from app.core import migrate
from app.core.config import Settings
from app.core.db import get_engine
from app.gpu_models import service as gpu_model_service


def prepare_database(settings: Settings) -> None:
    migrate.upgrade(settings.resolved_database_url)
    with Session(get_engine()) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
