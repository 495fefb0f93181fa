"""A real Ray cluster for the tests: a head and two workers on this machine.

Started once per session by the ``ray_cluster`` fixture (tests that use it share it: a
Ray start takes ~30 s on two cores). Ports are away from Redis's 6379 and the 6380-6400
range other tests use: the GCS on 26379, the dashboard (state, Jobs and Serve APIs) on
28265. Each worker has 4 GPUs by Ray's count (``--num-gpus 4``; Ray hands them out
without looking for devices) and labels naming it (``shaper.io/node=ray-w1``) and its
GPU model (``shaper.io/gpu-model=A10``); the head has none, so work goes to the workers.

Every Ray process inherits a marker variable from the ``ray start`` that began it, and
teardown kills the processes that carry it (by PID): ``ray stop`` would stop every Ray
cluster on the machine, not only this one. The scripts the tests run as Ray jobs and
Serve applications are in tests/connectors/data/ray, on the workers' PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS_DIR = REPO / "tests" / "connectors" / "data" / "ray"
GCS_PORT = 26379
DASHBOARD_PORT = 28265
WORKERS = ("ray-w1", "ray-w2")
GPUS_PER_WORKER = 4
GPU_MODEL = "A10"
MARKER = "SHAPER_RAY_TEST_CLUSTER"
START_TIMEOUT_S = 120.0


@dataclass
class RayCluster:
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{DASHBOARD_PORT}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{GCS_PORT}"

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.dashboard_url}{path}", params=params, timeout=30)
        response.raise_for_status()
        return response.json()

    def state(self, kind: str) -> list[dict[str, Any]]:
        document = self.get(f"/api/v0/{kind}", detail=1, limit=10_000)
        result: list[dict[str, Any]] = document["data"]["result"]["result"]
        return result

    def job(self, submission_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.get(f"/api/jobs/{submission_id}")
        return job

    def submit(self, entrypoint: str, *, submission_id: str, metadata: dict[str, str]) -> str:
        response = httpx.post(
            f"{self.dashboard_url}/api/jobs/",
            json={"entrypoint": entrypoint, "submission_id": submission_id, "metadata": metadata},
            timeout=30,
        )
        response.raise_for_status()
        return str(response.json()["submission_id"])

    def stop_all_jobs(self) -> None:
        for job in self.get("/api/jobs/"):
            if job["status"] in ("PENDING", "RUNNING") and job.get("submission_id"):
                httpx.post(f"{self.dashboard_url}/api/jobs/{job['submission_id']}/stop", timeout=30)
        wait_for(
            "every Ray job to end",
            lambda: all(j["status"] not in ("PENDING", "RUNNING") for j in self.get("/api/jobs/")),
        )

    def node_ids(self) -> dict[str, str]:
        """Shaper's name of each live worker → its Ray node id."""
        return {
            node["labels"]["shaper.io/node"]: node["node_id"]
            for node in self.state("nodes")
            if node["state"] == "ALIVE" and "shaper.io/node" in node["labels"]
        }

    def alive_nodes(self) -> int:
        try:
            return sum(1 for n in self.state("nodes") if n["state"] == "ALIVE")
        except httpx.HTTPError:
            return 0

    def start(self) -> None:
        for port in (GCS_PORT, DASHBOARD_PORT):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise AssertionError(
                        f"port {port} is taken (another Ray cluster?): the test cluster needs it"
                    )
        self._ray_start(
            "--head",
            f"--port={GCS_PORT}",
            f"--dashboard-port={DASHBOARD_PORT}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            "--ray-client-server-port=28266",
            "--dashboard-agent-listen-port=28300",
            "--num-cpus=1",
            "--num-gpus=0",
            "--labels=shaper.io/node=ray-head",
            f"--temp-dir={self.directory}",
            name="head",
        )
        wait_for("the Ray head", lambda: self.alive_nodes() == 1, START_TIMEOUT_S)
        for index, name in enumerate(WORKERS, start=1):
            # One at a time: on two busy cores, raylets starting together miss Ray's fixed
            # 30 s registration window.
            self._start_worker(name, gpus=GPUS_PER_WORKER, cpus=2, agent_port=28300 + index)

    def add_worker(self, name: str, *, gpus: int) -> None:
        """One more worker, for a test that ends its life (a drain)."""
        self._start_worker(name, gpus=gpus, cpus=1, agent_port=28300 + len(self.processes))

    def _start_worker(self, name: str, *, gpus: int, cpus: int, agent_port: int) -> None:
        before = self.alive_nodes()
        for attempt in range(2):  # a second try when the first timed out registering
            process = self._ray_start(
                f"--address={self.gcs_address}",
                f"--num-cpus={cpus}",
                f"--num-gpus={gpus}",
                f"--labels=shaper.io/node={name},shaper.io/gpu-model={GPU_MODEL}",
                f"--dashboard-agent-listen-port={agent_port}",
                name=f"{name}-{attempt}",
            )
            started = wait_for(
                f"Ray worker {name}",
                lambda started=process: self.alive_nodes() > before or started.poll() is not None,
                START_TIMEOUT_S,
            )
            if started and process.poll() is None:
                return
        raise AssertionError(f"Ray worker {name} did not start twice")

    def _ray_start(self, *options: str, name: str) -> subprocess.Popen[bytes]:
        # --block: ray start stays up as the parent of what it starts, and exits when they do.
        env = {
            **os.environ,
            MARKER: str(self.directory),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join([str(JOBS_DIR), str(REPO)]),
        }
        log = open(self.directory / f"ray-start-{name}.log", "wb")  # noqa: SIM115
        ray = Path(sys.executable).with_name("ray")
        process = subprocess.Popen(
            [str(ray), "start", "--block", "--disable-usage-stats", *options],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        # A short grace, then SIGKILL: after SIGTERM the raylets take ~10 s to exit and the
        # GCS and the dashboard's processes more than 20 s (measured), and nothing of this
        # throwaway cluster needs a clean exit; a 15 s grace was waited out in every run.
        deadline = time.monotonic() + 3
        while self.marked_processes() and time.monotonic() < deadline:
            time.sleep(0.3)
        for pid in self.marked_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def marked_processes(self) -> list[int]:
        """Processes of this cluster: those carrying its marker in their environment."""
        wanted = f"{MARKER}={self.directory}".encode()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if state != "Z" and wanted in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def logs(self) -> str:
        return "".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.directory.glob("ray-start-*.log"))
        )


def wait_for(what: str, condition: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)


# The modules that import the fixture each get their own session-scoped copy of it
# (pytest keys fixtures by where it finds them): they share one cluster through this.
_shared: dict[str, Any] = {"cluster": None, "users": 0}


@pytest.fixture(scope="session", name="ray_cluster")
def ray_cluster_fixture() -> Iterator[RayCluster]:
    """Import it into a test module (``from tests.support.ray_cluster import
    ray_cluster_fixture``) and ask for ``ray_cluster``."""
    if _shared["cluster"] is None:
        # Short: Ray's unix sockets live under it and their paths may not pass 107 bytes.
        directory = Path(tempfile.mkdtemp(prefix="shaper-ray-", dir="/tmp"))
        cluster = RayCluster(directory)
        try:
            cluster.start()
        except AssertionError as error:
            logs = cluster.logs()
            cluster.stop()
            pytest.fail(f"the Ray test cluster did not start ({error}):\n{logs}", pytrace=False)
        _shared["cluster"] = cluster
    _shared["users"] += 1
    try:
        yield _shared["cluster"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0:
            _shared["cluster"].stop()
            _shared["cluster"] = None
