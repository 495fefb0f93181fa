"""The suite's own grouping for pytest-xdist (tests/support/parallel.py): the modules of one
real service run on one worker, one after another; other modules are units of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.parallel import service_groups

REPO = Path(__file__).resolve().parent.parent


def test_modules_sharing_a_service_share_a_group_and_two_services_of_one_module_merge() -> None:
    groups = service_groups(
        [
            ("a.py", ["session", "slurm_cluster"]),
            ("b.py", ["slurm_b_cluster"]),
            ("c.py", ["ray_cluster"]),
            ("d.py", ["session"]),
            ("e.py", ["k8s_cluster"]),
            ("f.py", ["real_node_started"]),
        ]
    )
    assert groups == {
        "a.py": "slurm",
        "b.py": "slurm",
        "c.py": "ray",
        "e.py": "kubernetes",
        "f.py": "kubernetes-real-node",
    }
    # A module that needs Ray and Slurm at once: all of both run on one worker.
    merged = service_groups(
        [
            ("a.py", ["slurm_cluster"]),
            ("c.py", ["ray_cluster"]),
            ("g.py", ["ray_cluster", "slurm_b_cluster"]),
        ]
    )
    assert set(merged.values()) == {"ray+slurm"}


SUITE = {
    "conftest.py": """
import os
import time
import pytest
from tests.conftest import (
    pytest_collection_modifyitems, pytest_configure, pytest_xdist_make_scheduler
)

def note(kind):
    time.sleep(0.3)
    with open("workers.txt", "a") as out:
        out.write(f"{kind} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.fixture(scope="session")
def slurm_cluster():
    return note
""",
    # Each test notes its worker. Four modules of two tests: without the service's group,
    # the two service modules would be two units, one per worker.
    "test_one.py": """
def test_a(slurm_cluster):
    slurm_cluster("SERVICE")
def test_b(slurm_cluster):
    slurm_cluster("SERVICE")
""",
    "test_plain.py": """
from conftest import note
def test_c():
    note("PLAIN")
def test_d():
    note("PLAIN")
""",
    "test_plain2.py": """
from conftest import note
def test_e():
    note("OTHER")
def test_f():
    note("OTHER")
""",
    "test_two.py": """
def test_g(slurm_cluster):
    slurm_cluster("SERVICE")
def test_h(slurm_cluster):
    slurm_cluster("SERVICE")
""",
}


def run_suite(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_services_modules_run_on_one_worker_and_a_plain_module_stays_whole(
    tmp_path: Path,
) -> None:
    done = run_suite(tmp_path, "--dist", "loadgroup")
    assert done.returncode == 0, done.stdout + done.stderr
    noted = [line.split() for line in (tmp_path / "workers.txt").read_text().splitlines()]
    service = [worker for kind, worker in noted if kind == "SERVICE"]
    plain = [worker for kind, worker in noted if kind == "PLAIN"]
    other = [worker for kind, worker in noted if kind == "OTHER"]
    assert len(service) == 4 and len(set(service)) == 1, noted
    assert len(plain) == 2 and len(set(plain)) == 1, noted
    assert len(other) == 2 and len(set(other)) == 1, noted


def test_without_loadgroup_the_run_is_refused_with_the_option_to_pass(tmp_path: Path) -> None:
    done = run_suite(tmp_path)
    assert done.returncode != 0
    assert "--dist loadgroup" in done.stdout + done.stderr
