"""Fixtures for the node agent's tests: real processes, real CRIU, cleaned up by PID.

The CRIU tests need CRIU >= 4.1 (Debian 12's 3.17 fails on kernels >= 6.13). They never
skip: without a working CRIU they fail and say to run scripts/install-criu.sh as root.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.backends.base import BackendUnavailable
from agent.backends.criu import CriuBackend, find_criu
from agent.settings import AgentSettings
from agent.workload import WorkloadStore
from tests.support.processes import Reaper


@pytest.fixture(scope="session")
def criu_binary() -> str:
    try:
        path, _version = find_criu(AgentSettings().criu)  # $SHAPER_CRIU, as the agent
    except BackendUnavailable as error:
        unavailable = str(error)
    else:
        unavailable = ""
    if unavailable:
        pytest.fail(unavailable, pytrace=False)
    check = subprocess.run([path, "check"], capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        pytest.fail(
            f"`{path} check` failed ({check.stderr.strip()}): run scripts/install-criu.sh as root",
            pytrace=False,
        )
    return path


@pytest.fixture
def store(tmp_path: Path) -> WorkloadStore:
    return WorkloadStore(tmp_path / "state")


@pytest.fixture
def criu(store: WorkloadStore, criu_binary: str) -> CriuBackend:
    return CriuBackend(store=store, criu=criu_binary)


@pytest.fixture
def reaper(tmp_path: Path) -> Iterator[Reaper]:
    reaper = Reaper(tmp_path)
    yield reaper
    reaper.cleanup()
