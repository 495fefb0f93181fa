"""Pods of the Armada test server run as real local processes, as an executor would run
them: each job the server has running on a node runs its container's command (command,
then args, with the container's env) under ``shaper agent exec --wait`` — the node agent's
foreground body, as a Slurm job's batch script runs it — in that node's agent state
directory, with the job's workload id (``shaper.io/workload``, else its job id).

So the node agent (agent.steps.StepExecutor over the same state directory) can checkpoint
the job with CRIU and stage its image, and when Armada runs the job again on that node the
body restores it from the staged image instead of starting it over (agent.foreground).

:meth:`LocalPods.sync` is the executor's loop, one pass: a job that runs and has no
process gets one; a process whose job Armada cancelled or preempted is stopped (SIGTERM:
exec stops the workload, or ends at once when the agent has checkpointed it); a process
that ended while its job ran reports the job's end (succeeded on status 0, else failed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from agent.workload import WorkloadStore, kill_workload
from tests.support.armada_server import ArmadaTestServer, ServerJob

WORKLOAD_ANNOTATION = "shaper.io/workload"  # connectors.armada.jobs: the job's lineage


class LocalPods:
    def __init__(self, server: ArmadaTestServer, root: Path, *, backend: str = "criu") -> None:
        self.server = server
        self.root = root
        self.backend = backend
        # Armada job id -> its pod's process.
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def state_dir(self, node: str) -> Path:
        """The node agent's state directory on ``node``."""
        return self.root / "nodes" / node

    def sync(self) -> None:
        with self.server._lock:
            jobs = {job.job_id: (job.state, job) for job in self.server.jobs.values()}
        for job_id, (state, job) in jobs.items():
            process = self.processes.get(job_id)
            if state == "running" and process is None:
                self.processes[job_id] = self._start(job)
            elif process is not None and process.poll() is None and state != "running":
                process.send_signal(signal.SIGTERM)  # Armada deletes the pod
        for job_id, process in list(self.processes.items()):
            status = process.poll()
            state, job = jobs.get(job_id, ("", None))
            if status is not None and state == "running" and job is not None:
                self.server.finish(job_id, failed=None if status == 0 else f"exit status {status}")

    def _start(self, job: ServerJob) -> subprocess.Popen[bytes]:
        (container,) = job.spec.pod_specs[0].containers
        workload = job.spec.annotations.get(WORKLOAD_ANNOTATION) or job.job_id
        env = {**os.environ, **{e.name: e.value for e in container.env}}
        log = self.root / "pods" / f"{job.job_id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs[job.job_id] = log
        with open(log, "wb") as output:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent",
                    "exec",
                    "--wait",
                    "--backend",
                    self.backend,
                    "--id",
                    workload,
                    "--state-dir",
                    str(self.state_dir(job.node)),
                    "--",
                    *container.command,
                    *container.args,
                ],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def close(self) -> None:
        """Every pod and every workload the agents manage here, gone: each pod stopped as
        Armada stops one (SIGTERM: exec stops its workload, a restored one included, whose
        record a SIGKILL could leave behind), then whatever is left killed."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        nodes = self.root / "nodes"
        for state_dir in nodes.iterdir() if nodes.exists() else []:
            for workload in WorkloadStore(state_dir).all():
                kill_workload(workload, timeout=10)
