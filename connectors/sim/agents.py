"""Simulated node agents and connector for a SimCluster: saga steps answered in-process.

A real cluster's steps go to Celery queues that node agents (``agent.<cluster>.<node>``)
and its connector (``connector.<cluster>``) consume. A simulated cluster has neither
processes to checkpoint nor a scheduler daemon, so :class:`SimExecutors` answers both kinds
of step against the SimCluster itself, keeping the agents' rules: a step whose key was
answered before is answered again from the journal (``duplicate``), a step carrying an
older fencing generation than the job has seen is ``refused``, and a job never runs on two
nodes at once. Checkpoints are instant and keep the job's progress; "images" are records.

Scheduler-level steps go through connectors.actions.ConnectorStepExecutor with the
SimCluster as its connector, exactly as the Slurm connector's do.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.sim.cluster import SimCluster
from wire.queues import agent_queue_prefix
from wire.steps import AgentStep, Outcome, StepReport, StepRequest


class SimExecutors:
    """handle(step) → report, for every step the saga sends to one simulated cluster."""

    def __init__(self, cluster: SimCluster, *, state_dir: Path) -> None:
        self.cluster = cluster
        self.connector = ConnectorStepExecutor(
            cluster, cluster=cluster.cluster, state_dir=state_dir
        )
        self._lock = threading.Lock()
        self._answers: dict[str, dict[str, Any]] = {}
        # Per (node, job), like each real agent's fence file.
        self._generation: dict[tuple[str, str], int] = {}
        self._left_at: dict[tuple[str, str], int] = {}

    def queues(self) -> tuple[str, str]:
        """The queue prefixes this executor answers: its connector's and its agents'."""
        return self.connector.name, agent_queue_prefix(self.cluster.cluster)

    def handle(self, queue: str, step: dict[str, Any]) -> dict[str, Any]:
        connector_queue, agent_prefix = self.queues()
        if queue == connector_queue:
            report = self.connector.handle(step)
            if report is None:
                raise ValueError(f"malformed step for {queue}: {step!r}")
            return report.model_dump(mode="json")
        request = StepRequest.model_validate(step)
        return self._agent(queue.removeprefix(agent_prefix), queue, request).model_dump(mode="json")

    def _agent(self, node: str, queue: str, request: StepRequest) -> StepReport:
        job_id, generation = request.workload_id or "", request.generation
        with self._lock:
            if request.key in self._answers:
                return StepReport.replayed(self._answers[request.key])
            fence = (node, job_id)
            seen = self._generation.get(fence, 0)
            stale = generation < seen or (
                request.step == AgentStep.restore and generation <= self._left_at.get(fence, -1)
            )
            if stale:
                return request.answer(
                    executor=queue,
                    ok=False,
                    outcome=Outcome.refused,
                    error=f"stale fencing token: generation {generation}, seen {seen}",
                )
            self._generation[fence] = max(seen, generation)
            try:
                result = self._run(request.step, node, job_id, request.args)
            except ConnectorError as error:
                report = request.answer(
                    executor=queue, ok=False, error=str(error), retryable=error.retryable
                )
            else:
                report = request.answer(executor=queue, ok=True, result=result)
                if request.step in (AgentStep.checkpoint, AgentStep.release):
                    self._left_at[fence] = max(self._left_at.get(fence, -1), generation)
            if report.ok or not report.retryable:
                self._answers[request.key] = report.model_dump(mode="json")
            return report

    def _run(self, name: str, node: str, job_id: str, args: dict[str, Any]) -> dict[str, Any]:
        cluster = self.cluster
        if name == AgentStep.checkpoint:
            done = cluster.take_off(job_id, node)
            image = {
                "backend": "sim",
                "image_dir": f"sim://{node}/{job_id}",
                "done_s": done.total_seconds(),
            }
            return {"image": image, "summary": f"simulated checkpoint after {done} of work"}
        if name == AgentStep.transfer:
            return {"image_dir": f"sim://{node}/{job_id}", "summary": "simulated image copied"}
        if name == AgentStep.stage:
            return {"image_dir": f"sim://{node}/{job_id}", "summary": "simulated image staged"}
        if name == AgentStep.restore:
            staged = args.get("image")
            if staged is None:
                raise ConnectorError(f"no image to restore {job_id} from", retryable=False)
            cluster.put_on(job_id, node, timedelta(seconds=float(staged["done_s"])))
            return {"summary": f"restored on {node} (simulated)"}
        if name == AgentStep.confirm:
            if not cluster.runs_on(job_id, node):
                raise ConnectorError(f"job {job_id} does not run on {node}", retryable=False)
            return {"summary": f"running on {node}"}
        if name == AgentStep.release:
            stopped = cluster.stop_on(job_id, node)
            return {
                "stopped": stopped,
                "summary": "stopped and released" if stopped else "released",
            }
        raise ConnectorError(f"simulated agents do not know step {name!r}", retryable=False)
