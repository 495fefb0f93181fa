"""The Slurm connector: reads nodes and jobs, and acts on jobs through ``scontrol``/``scancel``.

Reads go to slurmrestd when ``rest_url`` is configured, else to ``squeue --json`` and
``sinfo --json``; both give the same :class:`ClusterState`. A read either returns the whole
state or raises :class:`ConnectorError` — never part of it.

Actions are idempotent where Slurm lets them be (cancelling a finished job, holding a held
job, suspending a suspended one succeed), so a retried task does no harm.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from connectors.base import ClusterState, ConnectorError, NodeReport, SchedulerKind
from connectors.slurm.client import RunCommand, SlurmCli, SlurmRest
from connectors.slurm.config import SlurmConnectorConfig
from connectors.slurm.parse import SlurmJob, api_version, parse_jobs, parse_nodes

logger = logging.getLogger(__name__)

_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")


def _already(message: str, *markers: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in markers)


class SlurmConnector:
    kind = SchedulerKind.slurm

    def __init__(
        self,
        config: SlurmConnectorConfig,
        *,
        run: RunCommand = subprocess.run,
        http_transport: httpx.BaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self._clock = clock
        self._cli = SlurmCli(config, run=run)
        self._rest = (
            SlurmRest(config, cli=self._cli, transport=http_transport, monotonic=monotonic)
            if config.rest_url
            else None
        )

    @property
    def mode(self) -> str:
        return "rest" if self._rest is not None else "cli"

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()

    def __enter__(self) -> SlurmConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------------

    def read_nodes(self) -> list[NodeReport]:
        mapping = self.config.mapping
        if self._rest is None:
            return parse_nodes(self._cli.read_json(["sinfo", "--json"], what="sinfo"), mapping)
        nodes = self._rest.get("nodes")
        partitions = None
        if api_version(nodes, what="nodes") == "v0.0.36":
            partitions = self._rest.get("partitions")  # v0.0.36 nodes do not name them
        return parse_nodes(nodes, mapping, partitions_document=partitions)

    def read_jobs(self) -> list[SlurmJob]:
        if self._rest is None:
            document = self._cli.read_json(["squeue", "--json"], what="squeue")
        else:
            document = self._rest.get("jobs")
        return parse_jobs(document, self.config.mapping)

    def read_state(self) -> ClusterState:
        observed_at = self._clock()
        nodes = self.read_nodes()
        jobs = self.read_jobs()
        return ClusterState(observed_at=observed_at, nodes=nodes, jobs=[job.report for job in jobs])

    # --- actions ---------------------------------------------------------------------------

    def _scontrol(self, *args: str, what: str, ok_if: tuple[str, ...] = ()) -> None:
        try:
            self._cli.run(["scontrol", *args], what=what)
        except ConnectorError as error:
            if ok_if and _already(str(error), *ok_if):
                logger.info("%s: already done (%s)", what, error)
                return
            raise

    @staticmethod
    def _job_id(external_id: str) -> str:
        if not _JOB_ID.match(external_id):
            raise ConnectorError(f"not a Slurm job id: {external_id!r}", retryable=False)
        return external_id

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        """Requeue a running job, optionally pinned to ``nodes`` / away from ``exclude``.

        ``requeuehold`` → update the node lists → ``release``, so the job cannot start
        elsewhere between the requeue and the pin. Slurm still waits ``cred_expire`` before
        it runs the job again. ``nodes=[]`` clears an earlier pin. A job that is already
        pending is only re-pinned. ``hold=True`` leaves it held (no ``release``): it runs
        again only when a plan starts it.
        """
        job_id = self._job_id(external_id)
        what = f"requeue job {job_id}"
        pin = nodes is not None or exclude is not None
        try:
            self._cli.run(["scontrol", "requeuehold", job_id], what=what)
        except ConnectorError as error:
            if not _already(str(error), "pending"):
                raise
            if not pin and not hold:
                return
            self._scontrol("hold", job_id, what=what)
        try:
            if nodes is not None:
                self._scontrol(
                    "update", f"JobId={job_id}", f"ReqNodeList={','.join(nodes)}", what=what
                )
            if exclude is not None:
                self._scontrol(
                    "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}", what=what
                )
        finally:
            if not hold:
                self._scontrol("release", job_id, what=what)

    def hold(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol("hold", job_id, what=f"hold job {job_id}")

    def release(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol("release", job_id, what=f"release job {job_id}")

    def suspend(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol(
            "suspend", job_id, what=f"suspend job {job_id}", ok_if=("already suspended",)
        )

    def resume(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol("resume", job_id, what=f"resume job {job_id}", ok_if=("not suspended",))

    def cancel(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        what = f"cancel job {job_id}"
        try:
            self._cli.run(["scancel", job_id], what=what)
        except ConnectorError as error:
            if _already(str(error), "already completing or completed"):
                return
            raise

    def update_node_count(self, external_id: str, *, nodes: int) -> None:
        if nodes < 1:
            raise ConnectorError(f"node count must be >= 1, got {nodes}", retryable=False)
        job_id = self._job_id(external_id)
        self._scontrol(
            "update",
            f"JobId={job_id}",
            f"NumNodes={nodes}-{nodes}",
            what=f"set node count of job {job_id} to {nodes}",
        )


def create_slurm_connector(**options: Any) -> SlurmConnector:
    """Registry factory: ``registry.create(SchedulerKind.slurm, cluster=…, rest_url=…)``.

    Options are :class:`SlurmConnectorConfig` fields, plus the injectables of
    :class:`SlurmConnector` (``run``, ``http_transport``, ``clock``, ``monotonic``).
    """
    runtime_keys = ("run", "http_transport", "clock", "monotonic")
    runtime = {key: options.pop(key) for key in runtime_keys if key in options}
    return SlurmConnector(SlurmConnectorConfig.model_validate(options), **runtime)
