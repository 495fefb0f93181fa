"""Federated moves on Kubernetes: ``SupportsSubmit`` (connectors.base) over batch/v1 Jobs.

``submit`` creates the Job a ``SubmitSpec`` describes (connectors.kubernetes.submission
says what it carries and how the Job is named and marked), in the namespace it names,
suspended when ``hold`` (a ``release`` — ``resume_job`` — lets it run), pinned to
``nodes`` by the same required hostname affinity ``recreate_job_pinned`` writes.
``withdraw`` deletes the Job of a move unless it already ran to its end. ``check_arrival``
(``SupportsArrivalCheck``: a pending job's move confirms its copy here before it cancels
the home copy) judges the Job and its pods (connectors.kubernetes.arrival).

The Job is found again by its mark, not by listing the watch's cache: a resent step may
come right after the create, before the watch delivered it. That needs ``list`` on
jobs in every namespace (the watch has it) and ``create`` on jobs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kubernetes import client

from connectors.arrival import rejected
from connectors.base import ConnectorError, check_move_name
from connectors.kubernetes import actions
from connectors.kubernetes.arrival import judge_job, ran_condition, took_place
from connectors.kubernetes.pods import OwnerRef, parse_external_id
from connectors.kubernetes.submission import (
    MOVE_MARK,
    job_from_spec,
    moved_job_name,
)
from wire.telemetry import SchedulerKind, SubmitSpec

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from connectors.kubernetes.config import KubernetesConnectorConfig

logger = logging.getLogger(__name__)


class KubernetesMoves:
    """``submit``/``withdraw`` of the Kubernetes connector: a mixin of its capabilities
    (it needs the connector's ``api``, ``cluster``, ``kind`` and ``config``). The Kueue
    connector overrides :meth:`job_to_create` and :meth:`after_submit`."""

    if TYPE_CHECKING:
        api: ApiClient
        cluster: str
        kind: SchedulerKind
        config: KubernetesConnectorConfig

    def submit(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str:
        """SupportsSubmit: create the Job of ``spec`` here as move ``name``; its id.

        Idempotent by name: a Job that carries the move's mark is returned as it is (not
        held or pinned again: it may have been released since), as is one that a submit
        racing this one created first."""
        check_move_name(name)
        what = f"submit {name} to {self.cluster}"
        existing = self.moved_jobs(name, what=what)
        if existing:
            found = existing[0]
            logger.info("%s: job %s was submitted for it before", what, job_id(found))
            self.after_submit(found, name=name, hold=hold, what=what)
            return job_id(found)
        body = self.job_to_create(spec, name=name, nodes=nodes, hold=hold, what=what)
        namespace = body["metadata"]["namespace"]
        if namespace not in self.config.accept_namespaces:
            # The Job would run with this namespace's ServiceAccounts and Secrets, which
            # the cluster it came from knows nothing of: only namespaces named for it.
            accepted = ", ".join(self.config.accept_namespaces) or "none"
            raise ConnectorError(
                f"{what}: namespace {namespace} does not take moved jobs (accept_namespaces: "
                f"{accepted})",
                retryable=False,
            )
        if self.config.namespaces and namespace not in self.config.namespaces:
            # Its telemetry would never report the job, and the control plane would take
            # it for gone the moment it arrived.
            raise ConnectorError(
                f"{what}: the job's namespace {namespace} is not among those this connector "
                f"reports ({', '.join(self.config.namespaces)})",
                retryable=False,
            )
        created = create_job(self.api, body, cluster=self.cluster, what=what)
        if created is None:
            raced = self.moved_jobs(name, what=what)
            if not raced:
                raise ConnectorError(
                    f"{what}: a job named {body['metadata']['name']} exists in namespace "
                    f"{body['metadata']['namespace']} without this move's mark",
                    retryable=False,
                )
            created = raced[0]
        self.after_submit(created, name=name, hold=hold, what=what)
        logger.info(
            "%s: created job %s%s%s",
            what,
            job_id(created),
            f", pinned to {','.join(nodes)}" if nodes else "",
            ", held" if hold else "",
        )
        return job_id(created)

    def withdraw(self, name: str) -> str | None:
        """SupportsSubmit: delete the Job submitted here as move ``name``; its id, or None
        when none exists (never arrived, or deleted already: a second withdraw). A Job of
        the move that already ran here to its end is a non-retryable error: the move took
        place, and its source copy must not run a second time. One that ended before any
        pod ran did no work: it is deleted, as the arrival check that rejected it expects
        (``connectors.kubernetes.arrival.took_place``), and the source copy is released."""
        check_move_name(name, step="withdraw")
        what = f"withdraw {name} from {self.cluster}"
        live = [j for j in self.moved_jobs(name, what=what) if not j.metadata.deletion_timestamp]
        # The pods say whether a Job its deadline ended ran (took_place): read for ended
        # Jobs only, as the arrival check reads them, so that both judge alike.
        ran = [
            (j, ended)
            for j in live
            if ran_condition(j) is not None and (ended := took_place(j, self.current_pods(j)))
        ]
        if ran:
            job, ended = ran[0]
            raise ConnectorError(
                f"{what}: job {job_id(job)} of this move already ran here and ended "
                f"({ended}): the move took place, so its source copy must not run again",
                retryable=False,
            )
        if not live:
            logger.info("%s: no job of that move waits or runs here", what)
            return None
        for job in live:
            actions.delete_job(self.api, namespace=job.metadata.namespace, job=job.metadata.name)
        logger.info("%s: deleted job %s", what, ",".join(job_id(j) for j in live))
        return job_id(live[0])

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: whether the Job a move created here runs here, from the
        Job and its pods as the API server has them now (connectors.kubernetes.arrival)."""
        job = self.arrived_job(external_id)
        return judge_job(job, self.current_pods(job), external_id)

    def arrived_job(self, external_id: str) -> client.V1Job:
        """The Job ``external_id`` now; gone (deleted here by someone) is a rejection."""
        owner = parse_external_id(external_id)
        if owner.kind != "Job":
            raise rejected(f"{external_id} is a {owner.kind}, and moves create Jobs only")
        try:
            return actions.read_job(self.api, namespace=owner.namespace, job=owner.name)
        except actions.ObjectGone:
            raise rejected(f"job {external_id} no longer exists here") from None

    def current_pods(self, job: client.V1Job) -> list[client.V1Pod]:
        """The Job's pods as the API server lists them now (not the watch's cache: a
        confirm must not judge what it has not seen yet), by their controller-uid label."""
        core = client.CoreV1Api(self.api)
        namespace = job.metadata.namespace
        listed = actions.call(
            "list",
            f"pods of job {job.metadata.name} in {namespace}",
            lambda: core.list_namespaced_pod(
                namespace,
                label_selector=f"{actions.JOB_UID_LABEL}={job.metadata.uid}",
                _request_timeout=actions.REQUEST_TIMEOUT_S,
            ),
        )
        pods: list[client.V1Pod] = listed.items
        return pods

    # --- hooks for the Kueue connector -----------------------------------------------------

    def job_to_create(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None,
        hold: bool,
        what: str,
    ) -> dict[str, Any]:
        """The Job ``submit`` creates: held is suspended (``release`` resumes it)."""
        return job_from_spec(
            spec,
            move=name,
            scheduler=self.kind,
            cluster=self.cluster,
            nodes=nodes,
            suspend=hold,
            portable_namespace=self.config.portable_namespace,
        )

    def after_submit(self, job: client.V1Job, *, name: str, hold: bool, what: str) -> None:
        """What a submit does once its Job exists (created now or before): nothing here."""

    # --- lookups ---------------------------------------------------------------------------

    def moved_jobs(self, name: str, *, what: str) -> list[client.V1Job]:
        """The Jobs of move ``name`` in any namespace, oldest first: the label finds them,
        the annotation (the whole move name) confirms."""
        batch = client.BatchV1Api(self.api)
        selector = f"{MOVE_MARK}={moved_job_name(name)}"
        listed = actions.call(
            "list",
            f"jobs labelled {selector} ({what})",
            lambda: batch.list_job_for_all_namespaces(
                label_selector=selector, _request_timeout=actions.REQUEST_TIMEOUT_S
            ),
        )
        mine = [j for j in listed.items if (j.metadata.annotations or {}).get(MOVE_MARK) == name]
        return sorted(mine, key=lambda j: (j.metadata.creation_timestamp, j.metadata.name))


def job_id(job: client.V1Job) -> str:
    return OwnerRef("Job", job.metadata.namespace, job.metadata.name).external_id


def create_job(
    api: ApiClient, body: dict[str, Any], *, cluster: str, what: str
) -> client.V1Job | None:
    """Create the Job; None when one of its name exists already (409)."""
    batch = client.BatchV1Api(api)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        created: client.V1Job = actions.call(
            "create",
            f"jobs {name} in {namespace}",
            lambda: batch.create_namespaced_job(
                namespace, body, _request_timeout=actions.REQUEST_TIMEOUT_S
            ),
        )
    except actions.ObjectGone as error:
        raise ConnectorError(
            f"{what}: namespace {namespace} does not exist in cluster {cluster} (the job "
            f"keeps the namespace it had; create it, with what the job needs in it): {error}",
            retryable=False,
        ) from error
    except actions.Conflict:
        return None
    return created
