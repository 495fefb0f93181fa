"""The Kueue connector: the Kubernetes connector plus Kueue's Workloads and queues.

It watches what the Kubernetes connector watches and Kueue's Workloads, LocalQueues,
ClusterQueues and ResourceFlavors (``kueue.x-k8s.io/v1beta2``), and reports each job with
what Kueue decided about it (connectors.kueue.workloads): held or admitted, why it waits,
its queue, team (ClusterQueue) and priority. Jobs that Kueue does not manage (no Workload)
are reported as the Kubernetes connector reports them. ``read_state`` keeps the reports
current change by change (:class:`KueueJobReports`).

Federated moves: a Job still waiting for admission reports ``SubmitSpec(scheduler=kueue,
native={"job": …})`` (connectors.kubernetes.submission says what ``job`` carries; its
``kueue.x-k8s.io/queue-name`` label travels), and ``submit``/``withdraw`` create and delete
such Jobs here, Kueue admitting them (connectors.kueue.capabilities).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from connectors.kubernetes.actions import lost_images_node, pods_stranded
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import OWNER_COLLECTIONS, KubernetesConnector
from connectors.kubernetes.incremental import Changes, JobReports, complete, key_order
from connectors.kubernetes.informer import Key, Object
from connectors.kubernetes.pins import LIFTING_PIN
from connectors.kubernetes.pods import (
    JobGroup,
    TranslationContext,
    job_report,
    parse_external_id,
)
from connectors.kueue import actions as kueue_actions
from connectors.kueue.capabilities import KueueCapabilities
from connectors.kueue.workloads import KueueQueues, workload_owner, workload_report
from wire.telemetry import JobReport, SchedulerKind

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_COLLECTIONS = {
    "workloads": f"{KUEUE_API}/workloads",
    "localqueues": f"{KUEUE_API}/localqueues",
    "clusterqueues": f"{KUEUE_API}/clusterqueues",
    "resourceflavors": f"{KUEUE_API}/resourceflavors",
}
# Collections whose every change may alter every job (through KueueQueues).
QUEUE_COLLECTIONS = ("localqueues", "clusterqueues", "resourceflavors")


class KueueConnector(KueueCapabilities, KubernetesConnector):
    kind = SchedulerKind.kueue

    def watched(self) -> dict[str, str]:
        return {**super().watched(), **KUEUE_COLLECTIONS}

    def upkeep(self) -> list[str]:
        """The Kubernetes connector's upkeep (its Jobs), then the Kueue Jobs' checkpoint
        images lost with their node (:meth:`forget_lost_images`)."""
        return [*super().upkeep(), *self.forget_lost_images()]

    def forget_lost_images(self) -> list[str]:
        """A Kueue Job to resume from checkpoint images on a node no longer in the cluster
        (judged from the caches, once the node cache holds the whole list; the actions ask
        the API server again, for the node too): held out of admission, it loses the
        pointer, in its pod sets and on the Job (actions.forget_lost_images), so that once
        admitted its pods are not held to that node for good; admitted, with its pods
        waiting for that node, its Workload is let go, the pointer taken off, and queued
        again (actions.evict_for_lost_images; one the upkeep left halfway, marked, first).
        Under the pins lock, only tried (as the Kubernetes upkeep's), for ``LIFTS_S``
        seconds a round at most; an error is logged and tried again next round. One line
        per Job."""
        known = self.known_nodes()
        if known is None:
            return []
        jobs = self.informers["jobs"]
        pods_by_job = self.pods_by_job()
        work: list[tuple[str, str, Callable[..., str | None], str]] = []
        for owner_id, workload in self.workloads_by_owner().items():
            owner = parse_external_id(owner_id)
            name = workload["metadata"]["name"]
            if LIFTING_PIN in (workload["metadata"].get("annotations") or {}):
                work.insert(0, (owner.namespace, name, kueue_actions.evict_for_lost_images, ""))
                continue
            job = jobs.get(owner.namespace, owner.name) if owner.kind == "Job" else None
            if job is not None and job["metadata"].get("uid") not in _owner_uids(workload):
                job = None  # a Job of that name made since: not this Workload's
            node = lost_images_node(job, known) if job is not None else None
            if job is None or node is None:
                continue
            if not kueue_actions.condition_true(workload, "QuotaReserved"):
                work.append((owner.namespace, name, kueue_actions.forget_lost_images, node))
            elif pods_stranded(pods_by_job.get(job["metadata"].get("uid") or "", [])):
                work.append((owner.namespace, name, kueue_actions.evict_for_lost_images, node))
        if not work or not self.pins_lock.acquire(blocking=False):
            return []
        try:
            return self.pin_work_within_budget(
                (
                    namespace,
                    name,
                    functools.partial(act, self.api, namespace=namespace, workload=name, node=node),
                )
                for namespace, name, act, node in work
            )
        finally:
            self.pins_lock.release()

    def queues(self) -> KueueQueues:
        return KueueQueues.of(
            local_queues=self.informers["localqueues"].items(),
            cluster_queues=self.informers["clusterqueues"].items(),
            flavors=self.informers["resourceflavors"].items(),
        )

    def workloads_by_owner(self) -> dict[str, Object]:
        """Workloads by their owner's external id (the job they stand for)."""
        wanted = set(self.config.namespaces)
        by_owner: dict[str, Object] = {}
        # In name order: of several Workloads of one owner the last by namespace/name
        # counts, whatever order the watch delivered them in.
        for workload in sorted(self.informers["workloads"].items(), key=_workload_order):
            owner = workload_owner(workload)
            if owner is None or (wanted and owner.namespace not in wanted):
                continue
            by_owner[owner.external_id] = workload
        return by_owner

    def job_reports(
        self, groups: dict[str, JobGroup], context: TranslationContext
    ) -> list[JobReport]:
        workloads = self.workloads_by_owner()
        queues = self.queues()
        reports: list[JobReport | None] = []
        for external_id, group in groups.items():
            workload = workloads.pop(external_id, None)
            if workload is None:
                reports.append(job_report(group, context))
            else:
                reports.append(workload_report(workload, group, context, queues))
        for workload in workloads.values():  # owners not seen: from the Workload alone
            owner = workload_owner(workload)
            assert owner is not None
            reports.append(workload_report(workload, JobGroup(owner), context, queues))
        return sorted((r for r in reports if r is not None), key=lambda r: r.external_id)

    def job_index(self) -> JobReports:
        return KueueJobReports(self, {kind: name for kind, (name, _) in OWNER_COLLECTIONS.items()})

    def workload_of(self, external_id: str) -> Object | None:
        """The Workload of a job (None when Kueue does not manage it): from the index that
        ``read_state`` keeps by owner (:class:`KueueJobReports`), brought up to date with
        the caches first, rather than a sort of every Workload per call."""
        owner = parse_external_id(external_id)
        self._check_synced()
        with self._reports_lock:
            self._reports.update()
            reports = self._reports
            assert isinstance(reports, KueueJobReports)
            return reports.workload(owner.external_id)


def _owner_uids(workload: Object) -> set[str]:
    return {r.get("uid") for r in workload["metadata"].get("ownerReferences") or []} - {None}


def _workload_order(workload: Object) -> tuple[str, str]:
    metadata = workload.get("metadata") or {}
    return key_order((metadata.get("namespace"), metadata["name"]))


class KueueJobReports(JobReports):
    """The Kubernetes connector's incremental reports plus the Workloads and queues: the
    equal of :meth:`KueueConnector.job_reports` (the invariant is
    connectors.kubernetes.incremental's)."""

    connector: KueueConnector

    def reset(self) -> None:
        super().reset()
        self.workload_owner: dict[Key, str] = {}
        self.workloads: dict[str, dict[Key, Object]] = {}
        self.queues = KueueQueues()

    def more_changes(self, changes: Changes, dirty: set[str]) -> bool:
        for key, workload in complete(
            changes["workloads"], lambda: list(self.workload_owner)
        ).items():
            before = self.workload_owner.pop(key, None)
            if before is not None:
                workloads = self.workloads[before]
                del workloads[key]
                if not workloads:
                    del self.workloads[before]
                dirty.add(before)
            owner = workload_owner(workload) if workload is not None else None
            if workload is None or owner is None:
                continue
            if self.wanted and owner.namespace not in self.wanted:
                continue
            self.workload_owner[key] = owner.external_id
            self.workloads.setdefault(owner.external_id, {})[key] = workload
            dirty.add(owner.external_id)
        if any(changes[name][0] or changes[name][1] for name in QUEUE_COLLECTIONS):
            self.queues = self.connector.queues()
            return True
        return False

    def more_ids(self) -> Iterable[str]:
        return self.workloads

    def workload(self, external_id: str) -> Object | None:
        """The Workload a job's report comes from: of several naming one owner, the last by
        namespace/name (as :meth:`KueueConnector.workloads_by_owner`)."""
        workloads = self.workloads.get(external_id)
        return workloads[max(workloads, key=key_order)] if workloads else None

    def report(
        self, external_id: str, group: JobGroup | None, context: TranslationContext
    ) -> JobReport | None:
        workload = self.workload(external_id)
        if workload is None:
            return super().report(external_id, group, context)
        if group is None:
            owner = workload_owner(workload)
            assert owner is not None
            group = JobGroup(owner)
        return workload_report(workload, group, context, self.queues)


def create_kueue_connector(**options: Any) -> KueueConnector:
    """The registry's factory: ``options`` are :class:`KubernetesConnectorConfig` fields."""
    return KueueConnector(KubernetesConnectorConfig(**options))
