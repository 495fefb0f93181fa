from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import Session

from app.core.db import make_engine
from app.tokens import service as token_service

SHAPER = [sys.executable, "-m", "app"]


def test_token_create_prints_a_working_token_once(tmp_path: Path) -> None:
    env = {**os.environ, "SHAPER_DATA_DIR": str(tmp_path)}
    env.pop("SHAPER_DATABASE_URL", None)
    done = subprocess.run(
        [*SHAPER, "token", "create", "--scope", "operator", "--name", "ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    plaintext = done.stdout.strip()
    assert plaintext.startswith("shp_") and plaintext not in done.stderr
    engine = make_engine(f"sqlite:///{tmp_path / 'shaper.db'}")
    with Session(engine) as session:
        principal = token_service.authenticate(
            session=session, plaintext=plaintext, now=datetime.now(UTC)
        )
    engine.dispose()
    assert principal.name == "ops" and principal.scopes == {"operator"}

    bad = subprocess.run(
        [*SHAPER, "token", "create", "--scope", "root"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "invalid token request" in bad.stderr
