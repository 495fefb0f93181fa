"""Real Slurm clusters (three nodes, two fake H100s each) for the connector tests: Slurm
22.05 from Debian 12's packages (``slurm``), and Slurm 24.11 built from source
(``slurm_24``: scripts/slurm-build.sh, which ``make test`` runs first), on other ports.

Each is started once per session with ``scripts/slurm-cluster.sh start --dir <tmp>
[--version 24.11]`` and stopped at the end. If one cannot start, every test that needs it
fails with the script's own reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from connectors.slurm import SlurmConnector, SlurmConnectorConfig
from tests.support import second_slurm_cluster
from tests.support.counter import COUNTER
from tests.support.second_slurm_cluster import SecondClusterLayout

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
REST_URL = "http://127.0.0.1:6820"
REST_URL_24 = "http://127.0.0.1:6830"  # scripts/slurm-cluster.sh --version 24.11
# Generous ceilings for conditions Slurm reaches in seconds; a requeued job waits
# cred_expire (5 s) before it may start again.
WAIT_S = 60.0


@dataclass
class SlurmCluster:
    directory: Path
    connectors: list[SlurmConnector] = field(default_factory=list)
    # Which Slurm (scripts/slurm-cluster.sh --version), where its CLI is (None: on PATH,
    # Debian's), its slurmrestd, and the API versions that slurmrestd serves, newest last.
    version: str = "22.05"
    bin_dir: Path | None = None
    rest_url: str = REST_URL
    rest_versions: tuple[str, ...] = ("v0.0.36", "v0.0.37", "v0.0.38")

    @property
    def rest_api(self) -> str:
        """The version the connector asks slurmrestd for by default on this Slurm."""
        return self.rest_versions[-1]

    @property
    def conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def jobs_dir(self) -> Path:
        return self.directory / "jobs"

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '')}"
        return env

    def script(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), command, "--dir", str(self.directory), "--version", self.version],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def run(self, *args: str) -> str:
        result = subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {result.stderr or result.stdout}")
        return result.stdout

    def sbatch(self, *options: str, command: str = "sleep 600") -> str:
        output = self.run(
            "sbatch",
            "--parsable",
            f"--chdir={self.jobs_dir}",
            f"--output={self.jobs_dir}/%j.out",
            *options,
            f"--wrap={command}",
        )
        return output.strip().split(";")[0]

    @property
    def connector_settings(self) -> tuple[str, ...]:
        """``--set`` values of a connector process for this cluster."""
        settings = (f"slurm_conf={self.conf}", 'mapping={"gpu_model_aliases": {"h100": "H100"}}')
        return settings if self.bin_dir is None else (*settings, f"bin_dir={self.bin_dir}")

    def submit_counter(
        self, root: Path, name: str, *options: str, gpus: int = 2
    ) -> tuple[str, Path]:
        """A checkpointable training job whose body is the counter under `agent exec
        --wait` (100 MB of state), the node agents' state under root/nodes/<node>."""
        count_file = root / f"{name}.count"
        body = (
            f"exec {sys.executable} -m agent exec --wait --backend criu "
            f"--state-dir {root}/nodes/$SLURMD_NODENAME -- "
            f"{sys.executable} {COUNTER} --count-file {count_file} --state-mb 100"
        )
        job_id = self.sbatch(
            f"--gres=gpu:h100:{gpus}",
            f"--job-name={name}",
            "--comment=shaper:kind=training,priority=50,checkpointable=true",
            *options,
            command=body,
        )
        return job_id, count_file

    def squeue(self) -> dict[str, dict[str, Any]]:
        """Slurm's own view, from a format that is not the JSON the connector parses."""
        fields = "JobID,State,Reason,NodeList,NumNodes,Partition,UserName,tres-per-node,Account"
        names = [name.lower() for name in fields.split(",")]
        output = self.run(
            "squeue", "-h", "-t", "all", "-O", ",".join(f"{f}:|" for f in fields.split(","))
        )
        rows = {}
        for line in output.splitlines():
            values = [value.strip() for value in line.split("|")][: len(names)]
            row = dict(zip(names, values, strict=True))
            rows[row["jobid"]] = row
        return rows

    def job(self, job_id: str) -> dict[str, Any]:
        return self.squeue()[job_id]

    def scontrol_job(self, job_id: str) -> str:
        return self.run("scontrol", "show", "job", "-d", job_id)

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.2)

    def wait_state(self, job_id: str, state: str, timeout: float = WAIT_S) -> dict[str, Any]:
        return self.wait_for(
            f"job {job_id} to be {state} (last: {self.job(job_id)})",
            lambda: (row := self.job(job_id))["state"] == state and row,
            timeout,
        )

    def reservations(self) -> list[str]:
        output = self.run("scontrol", "show", "reservation", "--oneliner")
        return re.findall(r"^ReservationName=(\S+)", output, flags=re.MULTILINE)

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True, check=False)
        self.wait_for(
            "all jobs to end",
            lambda: all(
                row["state"] in ("CANCELLED", "COMPLETED", "FAILED")
                for row in self.squeue().values()
            ),
        )
        for name in self.reservations():  # a reserved node is never "idle"
            self.run("scontrol", "delete", "reservation", name)
        self.wait_for("nodes to be idle", self.nodes_idle)

    def nodes_idle(self) -> bool:
        output = self.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t")
        return all(line.split()[1] == "idle" for line in output.splitlines())

    def config(self, **fields: Any) -> SlurmConnectorConfig:
        fields.setdefault("bin_dir", self.bin_dir)
        if "rest_url" in fields:
            fields.setdefault("rest_api_version", self.rest_api)
        return SlurmConnectorConfig(cluster="hpc-test", slurm_conf=self.conf, **fields)

    def connector(self, **fields: Any) -> SlurmConnector:
        """A connector closed when the test ends."""
        connector = SlurmConnector(self.config(**fields))
        self.connectors.append(connector)
        return connector

    def close_connectors(self) -> None:
        while self.connectors:
            self.connectors.pop().close()

    def pid(self, daemon: str) -> int:
        return int((self.directory / "run" / f"{daemon}.pid").read_text().strip())


def _started(cluster: SlurmCluster, what: str) -> None:
    started = cluster.script("start")
    if started.returncode != 0:
        cluster.script("stop")
        shutil.rmtree(cluster.directory, ignore_errors=True)
        pytest.fail(
            f"the {what} did not start (scripts/slurm-cluster.sh start --version "
            f"{cluster.version}, run as root with Debian's mirrors reachable):\n"
            f"{started.stderr}{started.stdout}",
            pytrace=False,
        )
    cluster.jobs_dir.mkdir()


def _stopped(cluster: SlurmCluster, what: str) -> None:
    stopped = cluster.script("stop")
    shutil.rmtree(cluster.directory, ignore_errors=True)
    if stopped.returncode != 0:
        raise RuntimeError(f"stopping the {what} failed:\n{stopped.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    # Not under pytest's 0700 base temp: slurmrestd runs unprivileged and reads etc/.
    directory = Path(tempfile.mkdtemp(prefix="shaper-slurm-test-", dir="/tmp"))
    directory.chmod(0o755)
    cluster = SlurmCluster(directory)
    _started(cluster, "Slurm test cluster")
    try:
        yield cluster
    finally:
        _stopped(cluster, "Slurm test cluster")


@pytest.fixture(scope="session")
def slurm_24_cluster() -> Iterator[SlurmCluster]:
    """Slurm 24.11 (scripts/slurm-build.sh's), on its own ports and munged."""
    built = subprocess.run(
        [str(REPO / "scripts" / "slurm-build.sh"), "--print"],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.fail(
            f"Slurm 24.11 is not built: run scripts/slurm-build.sh (make test does)\n"
            f"{built.stderr}",
            pytrace=False,
        )
    directory = Path(tempfile.mkdtemp(prefix="shaper-slurm24-test-", dir="/tmp"))
    directory.chmod(0o755)
    cluster = SlurmCluster(
        directory,
        version="24.11",
        bin_dir=Path(built.stdout.strip()) / "bin",
        rest_url=REST_URL_24,
        rest_versions=("v0.0.40", "v0.0.41", "v0.0.42"),
    )
    _started(cluster, "Slurm 24.11 test cluster")
    try:
        yield cluster
    finally:
        _stopped(cluster, "Slurm 24.11 test cluster")


Cluster = TypeVar("Cluster", bound=SlurmCluster)


def _idle_around(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with no job running, before and after the test."""
    cluster.cancel_all()
    yield cluster
    cluster.close_connectors()
    cluster.cancel_all()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield from _idle_around(slurm_cluster)


@pytest.fixture
def slurm_24(slurm_24_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield from _idle_around(slurm_24_cluster)


# --- a second cluster, for federated moves (tests/support/second_slurm_cluster.py) ----------


class SecondSlurmCluster(SlurmCluster):
    """The second cluster: the same helpers, its own name, nodes and partition."""

    layout: SecondClusterLayout

    def config(self, **fields: Any) -> SlurmConnectorConfig:
        return SlurmConnectorConfig(cluster="hpc-b", slurm_conf=self.conf, **fields)

    def nodes_idle(self) -> bool:
        output = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return all(line.split()[1] == "idle" for line in output.splitlines())


@pytest.fixture(scope="session")
def slurm_b_cluster(slurm_cluster: SlurmCluster) -> Iterator[SecondSlurmCluster]:
    """A second Slurm cluster beside ``slurm_cluster``, sharing its munged."""
    directory = Path(tempfile.mkdtemp(prefix="shaper-slurm-b-test-", dir="/tmp"))
    directory.chmod(0o755)
    layout = SecondClusterLayout(
        directory=directory,
        munge_socket=slurm_cluster.directory / "munge" / "munge.socket.2",
    )
    cluster = SecondSlurmCluster(directory)
    cluster.layout = layout
    try:
        second_slurm_cluster.start(layout)
    except second_slurm_cluster.SecondClusterError as error:
        second_slurm_cluster.stop(layout)
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"the second Slurm test cluster did not start: {error}", pytrace=False)
    cluster.jobs_dir.mkdir()  # where sbatch() writes a job's output (a missing one fails it)
    try:
        yield cluster
    finally:
        cluster.close_connectors()
        second_slurm_cluster.stop(layout)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def slurm_b(slurm_b_cluster: SecondSlurmCluster) -> Iterator[SecondSlurmCluster]:
    """The second cluster with no job running, before and after the test."""
    yield from _idle_around(slurm_b_cluster)
