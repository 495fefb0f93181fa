"""The Kueue connector: the Kubernetes connector plus Kueue's Workloads and queues.

It watches what the Kubernetes connector watches and Kueue's Workloads, LocalQueues,
ClusterQueues and ResourceFlavors (``kueue.x-k8s.io/v1beta2``), and reports each job with
what Kueue decided about it (connectors.kueue.workloads): held or admitted, why it waits,
its queue, team (ClusterQueue) and priority. Jobs that Kueue does not manage (no Workload)
are reported as the Kubernetes connector reports them.
"""

from __future__ import annotations

from typing import Any

from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.informer import Object
from connectors.kubernetes.pods import (
    JobGroup,
    TranslationContext,
    job_report,
    parse_external_id,
)
from connectors.kueue.workloads import KueueQueues, workload_owner, workload_report
from wire.telemetry import JobReport, SchedulerKind

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_COLLECTIONS = {
    "workloads": f"{KUEUE_API}/workloads",
    "localqueues": f"{KUEUE_API}/localqueues",
    "clusterqueues": f"{KUEUE_API}/clusterqueues",
    "resourceflavors": f"{KUEUE_API}/resourceflavors",
}


class KueueConnector(KubernetesConnector):
    kind = SchedulerKind.kueue

    def watched(self) -> dict[str, str]:
        return {**super().watched(), **KUEUE_COLLECTIONS}

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
        for workload in self.informers["workloads"].items():
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

    def workload_of(self, external_id: str) -> Object | None:
        """The Workload of a job, from the cache (None when Kueue does not manage it)."""
        owner = parse_external_id(external_id)
        return self.workloads_by_owner().get(owner.external_id)


def create_kueue_connector(**options: Any) -> KueueConnector:
    """The registry's factory: ``options`` are :class:`KubernetesConnectorConfig` fields."""
    return KueueConnector(KubernetesConnectorConfig(**options))
