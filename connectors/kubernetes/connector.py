"""The Kubernetes connector: telemetry from list+watch caches of the API server.

When Kueue is installed use ``--kind kueue`` (connectors.kueue): it reads the same
objects plus Kueue's Workloads, ClusterQueues and LocalQueues, so a job held by Kueue is
reported with Kueue's reason, queue and priority rather than only as a suspended Job.
This connector logs a hint at start when it finds Kueue's API group.

One :class:`Informer` per collection (nodes, pods, priority classes, and the owners it
watches: Jobs, Deployments, StatefulSets) keeps a cache current; ``read_state`` translates
the caches (connectors.kubernetes.nodes, connectors.kubernetes.pods), incrementally: only
the jobs and nodes that the changes since the previous call touched
(connectors.kubernetes.incremental; ``rebuild_state`` translates whole and equals it). It
raises a retryable :class:`ConnectorError` while any cache is not synced (the first list,
an API server outage, a re-list after 410). Every change a watch applies sets a flag that
``wait_for_change`` (``SupportsChangeWait``) waits on, so the runner pushes a change
within a fraction of a second instead of at its next interval.

Federated moves: a pending or running Job reports the spec that moves it to another
cluster (connectors.kubernetes.submission says what its ``native`` carries), and
``submit``/``withdraw`` create and delete such Jobs here (connectors.kubernetes.moves).

Shaper's node pins on Jobs last one run (connectors.kubernetes.pins): a stale one is
reported as the Job's own placement, and :meth:`upkeep` gives it back to the Job.

Subclasses (the Kueue connector) hook in at four places: :meth:`watched` (more
collections), :meth:`job_groups` (how pods and objects group into jobs) and
:meth:`job_reports` (how groups become reports), and :meth:`job_index`, which must do
incrementally what the two before do whole. Actions find their objects through
:attr:`api`, :meth:`owner_object` and :meth:`pods_of` (by external id).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from connectors.base import ConnectorError
from connectors.kubernetes import actions, pod_gates, pod_placement
from connectors.kubernetes.capabilities import KubernetesCapabilities
from connectors.kubernetes.client import api_client
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.incremental import JobReports
from connectors.kubernetes.informer import Informer, Object
from connectors.kubernetes.nodes import node_change_matters, node_report, node_state
from connectors.kubernetes.pins import LIFTING_PIN, PIN_ANNOTATION, Pin, read_pin
from connectors.kubernetes.pods import (
    JobGroup,
    OwnerRef,
    TranslationContext,
    group_pods,
    job_reports,
    owner_of,
    parse_external_id,
    pod_gpus,
    pod_live,
    pod_node,
    priorities,
)
from connectors.kubernetes.submission import job_submit_spec
from wire.telemetry import (
    ClusterState,
    JobReport,
    NodeReport,
    NodeState,
    SchedulerKind,
    SubmitSpec,
)

logger = logging.getLogger(__name__)

# Collections every Kubernetes connector watches: name → API path (all namespaces).
BASE_COLLECTIONS = {
    "nodes": "/api/v1/nodes",
    "pods": "/api/v1/pods",
    "priorityclasses": "/apis/scheduling.k8s.io/v1/priorityclasses",
}
# Owners watched as objects (so a Job without pods is seen): kind → (informer, API path).
OWNER_COLLECTIONS = {
    "Job": ("jobs", "/apis/batch/v1/jobs"),
    "Deployment": ("deployments", "/apis/apps/v1/deployments"),
    "StatefulSet": ("statefulsets", "/apis/apps/v1/statefulsets"),
}
KUEUE_GROUP_PATH = "/apis/kueue.x-k8s.io"
# How long an upkeep round may spend lifting stale pins (each suspends a Job and waits for
# its pods to go, about a second: the Job counts a pod being deleted as gone); the rest
# wait for the next round.
LIFTS_S = 10.0


class KubernetesConnector(KubernetesCapabilities):
    kind = SchedulerKind.kubernetes

    def __init__(
        self,
        config: KubernetesConnectorConfig,
        *,
        api: ApiClient | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        start: bool = True,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        # The one client of this connector; the actions use it too.
        self.api = (
            api
            if api is not None
            else api_client(kubeconfig=config.kubeconfig, context=config.context)
        )
        self._clock = clock
        self._changed = threading.Event()
        self._synced_once = False
        self._created = time.monotonic()
        self.informers: dict[str, Informer] = {
            name: Informer(
                api=self.api,
                path=path,
                name=name,
                page_size=config.page_size,
                stream_list=config.stream_list,
                on_change=self._changed.set,
                relevant=node_change_matters if name == "nodes" else None,
            )
            for name, path in self.watched().items()
        }
        self._reports = self.job_index()
        self._reports_lock = threading.Lock()
        self.pins_lock = threading.RLock()
        # How long a pod of a gang that lost one must have found no node before the upkeep
        # stops the gang to lift its pin (actions.gang_stranded); the tests shorten it.
        self.gang_stranded_s = actions.GANG_STRANDED_S
        # The last line said of a gang left pinned because stopping it would lose work, by
        # Job uid: said once, not every round.
        self._left_pinned: dict[str, str] = {}
        if start:
            self.start_watching()

    # --- hooks for subclasses --------------------------------------------------------------

    def watched(self) -> dict[str, str]:
        """The collections to watch: informer name → API path."""
        return {
            **BASE_COLLECTIONS,
            **dict(OWNER_COLLECTIONS.values()),
        }

    def job_groups(self) -> dict[str, JobGroup]:
        """Pods and watched owner objects grouped into jobs, by external id."""
        owners = {
            kind: self.informers[name].items() for kind, (name, _) in OWNER_COLLECTIONS.items()
        }
        return group_pods(self.informers["pods"].items(), owners, namespaces=self.config.namespaces)

    def job_reports(
        self, groups: dict[str, JobGroup], context: TranslationContext
    ) -> list[JobReport]:
        return job_reports(groups.values(), context)

    def job_index(self) -> JobReports:
        """What keeps ``read_state``'s reports current: the incremental equal of
        :meth:`job_groups` and :meth:`job_reports`, which a subclass overrides with them."""
        return JobReports(self, {kind: name for kind, (name, _) in OWNER_COLLECTIONS.items()})

    # --- lifecycle -------------------------------------------------------------------------

    def start_watching(self) -> None:
        # Not ``start``: that is the saga step (SupportsStart, connectors.kubernetes.capabilities).
        for informer in self.informers.values():
            informer.start()

    def close(self) -> None:
        for informer in self.informers.values():
            informer.stop()

    def __enter__(self) -> KubernetesConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(
            informer.wait_synced(max(0.0, deadline - time.monotonic()))
            for informer in self.informers.values()
        )

    def wait_for_change(self, timeout_s: float) -> bool:
        """``SupportsChangeWait``: True when a cache changed since the previous call (which
        this call consumes), False after ``timeout_s`` without one."""
        if not self._changed.wait(timeout_s):
            return False
        self._changed.clear()
        return True

    # --- reads -----------------------------------------------------------------------------

    def _check_synced(self) -> None:
        if not self._synced_once:
            # The first read waits for the first lists, so the first push is complete
            # rather than a retry later.
            remaining = self.config.sync_timeout_s - (time.monotonic() - self._created)
            self.wait_synced(max(0.0, remaining))
        unsynced = [i for i in self.informers.values() if not i.synced]
        if unsynced:
            reasons = "; ".join(str(i.error or f"{i.name}: not synced") for i in unsynced)
            raise ConnectorError(
                f"Kubernetes API of cluster {self.cluster} not in sync: {reasons}",
                retryable=True,
            )
        self._synced_once = True

    def read_nodes(self, pods: list[Object]) -> list[NodeReport]:
        held: dict[str, int] = {}
        for pod in pods:
            node = pod_node(pod)
            if node and pod_live(pod):
                held[node] = held.get(node, 0) + pod_gpus(pod)
        return sorted(
            (
                node_report(
                    node,
                    gpus_held=held.get(node["metadata"]["name"], 0),
                    aliases=self.config.gpu_model_aliases,
                    default_gpu_model=self.config.default_gpu_model,
                    ignored_taints=self.config.ignored_taints,
                )
                for node in self.informers["nodes"].items()
            ),
            key=lambda n: n.name,
        )

    def translation_context(self) -> TranslationContext:
        priority_classes, default_priority = priorities(self.informers["priorityclasses"].items())
        return TranslationContext(
            node_states={
                node["metadata"]["name"]: node_state(
                    node, ignored_taints=self.config.ignored_taints
                )
                for node in self.informers["nodes"].items()
            },
            priority_classes=priority_classes,
            default_priority=default_priority,
            gpu_model_aliases=self.config.gpu_model_aliases,
            include_cpu_only=self.config.include_cpu_only,
            submit_spec=self.submit_spec_reader(),
            replica_moves=self.config.pod_placement,
        )

    def submit_spec_reader(self) -> Callable[[Mapping[str, Any]], SubmitSpec | None] | None:
        """How a Job becomes the spec its report carries (None: ``submit_specs`` is off)."""
        if not self.config.submit_specs:
            return None
        return functools.partial(job_submit_spec, scheduler=self.kind)

    def read_state(self) -> ClusterState:
        """The cluster now: the reports kept current from the informers' changes
        (connectors.kubernetes.incremental), translating only what changed."""
        self._check_synced()
        observed_at = self._clock()
        with self._reports_lock:
            nodes, jobs = self._reports.update()
        return ClusterState(observed_at=observed_at, nodes=nodes, jobs=jobs)

    def rebuild_state(self) -> ClusterState:
        """The cluster now, translated whole from the caches: what ``read_state`` equals
        (slow at scale; for tests and for checking)."""
        self._check_synced()
        observed_at = self._clock()
        nodes = self.read_nodes(self.informers["pods"].items())
        jobs = self.job_reports(self.job_groups(), self.translation_context())
        return ClusterState(observed_at=observed_at, nodes=nodes, jobs=jobs)

    # --- SupportsUpkeep --------------------------------------------------------------------

    def upkeep(self) -> list[str]:
        """Let go the pods waiting on the placement gate (:meth:`let_go_gated_pods`), and
        make Shaper's pins last one run (:meth:`keep_pins_to_one_run`). One line each."""
        return [*self.let_go_gated_pods(), *self.keep_pins_to_one_run()]

    def keep_pins_to_one_run(self) -> list[str]:
        """Shaper's pins on the Jobs of its namespaces last one run
        (connectors.kubernetes.pins): a stamp whose run has a pod on a pinned node is
        marked started; a Job whose pin is stale and whose pods cannot be placed gets its
        own placement back (actions.lift_stale_pin, a few API calls and a wait for its
        pods to go), for ``LIFTS_S`` seconds a round at most — also a gang whose pinned run
        lost a pod that has found no node for ``gang_stranded_s`` while the others run,
        where stopping them loses no work (actions.gang_blocker; else it stays pinned, and
        that is said once); and a Job held to resume from checkpoint images on a node no
        longer in the cluster (actions.lost_images_node: by Shaper's pin or by the restore
        webhook), whose pods can never be placed, once the API server answers 404 for it —
        or a held (suspended) Job to resume from such images, which loses the pointer and
        stays held, so that a plan can start it elsewhere.
        What needs doing is judged from the caches, and the pins lock is only tried: a step
        holding it (a move waits up to a minute) leaves the work to the next round rather
        than hold up the telemetry this runs beside. A Job that cannot be handled now is
        logged and tried again next round. One line per lift and per gang left pinned, for
        the caller to log."""
        namespaces = set(self.config.namespaces)
        pods_by_job = self.pods_by_job()
        marks: list[tuple[str, str, str]] = []
        lifts: list[tuple[str, str]] = []
        said: list[str] = []
        stranded: set[str] = set()  # uids of the gangs left pinned (_left_pinned_once)
        known = self.known_nodes()
        for job in self.informers["jobs"].items():
            metadata = job.get("metadata") or {}
            namespace, name = metadata.get("namespace") or "default", metadata["name"]
            annotations = metadata.get("annotations") or {}
            pin = read_pin(annotations)
            lifting = LIFTING_PIN in annotations
            if (pin is None and not lifting and actions.lost_images_node(job, known) is None) or (
                namespaces and namespace not in namespaces
            ):
                continue
            pods = pods_by_job.get(metadata.get("uid") or "", [])
            template_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
            if pin is not None and not pin.started and _ran_pinned(pin, pods, template_spec):
                marks.append((namespace, name, annotations[PIN_ANNOTATION]))
                continue
            if lifting:  # a lift left halfway first: its Job waits suspended
                lifts.insert(0, (namespace, name))
                continue
            judged = actions.judge_lift(
                job,
                pods,
                known_nodes=known,
                gang_stranded_s=self.gang_stranded_s,
                now=self._clock(),
            )
            if judged.mark is not None:
                lifts.append((namespace, name))
            elif judged.blocked is not None and pin is not None:
                said.extend(self._left_pinned_once(job, pin, judged.blocked))
                stranded.add(_uid(job))
        # A Job gone, or no longer stranded, is said again should it strand again.
        self._left_pinned = {uid: self._left_pinned[uid] for uid in stranded}
        if not (marks or lifts) or not self.pins_lock.acquire(blocking=False):
            return said
        lines: list[str] = said
        try:
            for namespace, name, stamp in marks:
                mark = functools.partial(
                    actions.mark_pin_started, self.api, namespace=namespace, job=name, stamp=stamp
                )
                self._pin_work(namespace, name, mark)
            # A generator: each lift's clock is read when its turn comes.
            lines += self.pin_work_within_budget(
                (
                    namespace,
                    name,
                    functools.partial(
                        actions.lift_stale_pin,
                        self.api,
                        namespace=namespace,
                        job=name,
                        gang_stranded_s=self.gang_stranded_s,
                        now=self._clock(),
                        known_nodes=known,
                    ),
                )
                for namespace, name in lifts
            )
        finally:
            self.pins_lock.release()
        return lines

    def _left_pinned_once(self, job: Object, pin: Pin, blocker: str) -> list[str]:
        """The line that a gang stranded on a stale pin stays pinned, because stopping its
        running pods would lose their work; once per Job and reason."""
        metadata = job.get("metadata") or {}
        line = (
            f"job {metadata.get('name')} in {metadata.get('namespace') or 'default'}: a pod of "
            f"its gang lost on Shaper's pin to {','.join(pin.nodes)} finds no node; left "
            f"pinned, since stopping its running pods would lose work: {blocker}"
        )
        uid = _uid(job)
        if self._left_pinned.get(uid) == line:
            return []
        self._left_pinned[uid] = line
        return [line]

    def pods_by_job(self) -> dict[str, list[Object]]:
        """The cached pods of Jobs, by their Job's uid."""
        by_job: dict[str, list[Object]] = {}
        for pod in self.informers["pods"].items():
            uid = ((pod.get("metadata") or {}).get("labels") or {}).get(actions.JOB_UID_LABEL)
            if uid:
                by_job.setdefault(uid, []).append(pod)
        return by_job

    def known_nodes(self) -> set[str] | None:
        """Every node's name, to tell checkpoint images lost with their node; None until the
        cache holds the whole list (an empty or partial one would say every node left)."""
        nodes = self.informers["nodes"]
        return {n["metadata"]["name"] for n in nodes.items()} if nodes.synced else None

    def pin_work_within_budget(
        self, works: Iterable[tuple[str, str, Callable[[], object]]]
    ) -> list[str]:
        """Each ``(namespace, name, work)`` in turn (:meth:`_pin_work`), for ``LIFTS_S``
        seconds at most (the rest waits for the next round); the lines they answer, for the
        caller to log (connectors.runner.upkeep). The caller holds the pins lock."""
        deadline = time.monotonic() + LIFTS_S
        lines: list[str] = []
        for namespace, name, work in works:
            if time.monotonic() > deadline:
                break
            line = self._pin_work(namespace, name, work)
            if isinstance(line, str):
                lines.append(line)
        return lines

    @staticmethod
    def _pin_work(namespace: str, name: str, work: Callable[[], object]) -> object:
        """``work()`` on one Job's pin; an error is logged (the next round tries again)."""
        try:
            return work()
        except actions.ObjectGone:
            return None
        except ConnectorError as error:
            logger.warning("the pin of job %s/%s: %s", namespace, name, error)
            return None

    def let_go_gated_pods(self) -> list[str]:
        """Let go the pods of its namespaces that wait on the placement gate, each to the
        node its Job gives its index, or anywhere the template allows when that node is
        no longer up (connectors.kubernetes.pod_gates) — pods the Job controller created
        after the step that gated the Job returned (a failed pod replaced, a step cut
        short). With ``pod_placement`` on or off: turning it off strands nothing. One line
        per pod let go; a Job whose pods cannot be let go now is logged and retried."""
        namespaces = set(self.config.namespaces)
        gated = {
            (owner.namespace, owner.name)
            for pod in self.informers["pods"].items()
            if pod_placement.has_gate(pod.get("spec") or {})
            and (owner := owner_of(pod)).kind == "Job"
            and (not namespaces or owner.namespace in namespaces)
        }
        if not gated:
            return []
        usable = {
            node["metadata"]["name"]
            for node in self.informers["nodes"].items()
            if node_state(node, ignored_taints=self.config.ignored_taints) is NodeState.up
        }
        let_go: list[str] = []
        for namespace, name in sorted(gated):
            try:
                current = actions.read_job(self.api, namespace=namespace, job=name)
                found = pod_gates.ungate_pods(self.api, current, usable_nodes=usable)
            except actions.ObjectGone:
                continue  # its pods go with it
            except ConnectorError as error:
                logger.warning("pods of job %s/%s wait on their gate: %s", namespace, name, error)
                continue
            let_go.extend(f"placed {line}" for line in found.let_go)
        return let_go

    # --- lookups for the actions -----------------------------------------------------------

    def owner_object(self, external_id: str) -> Object | None:
        """The watched object an external id stands for (a Job, Deployment or
        StatefulSet), from the cache; None for kinds that are not watched or gone."""
        owner = parse_external_id(external_id)
        collection = OWNER_COLLECTIONS.get(owner.kind)
        if collection is None and owner.kind == "Pod":
            return self.informers["pods"].get(owner.namespace, owner.name)
        if collection is None:
            return None
        return self.informers[collection[0]].get(owner.namespace, owner.name)

    def pods_of(self, external_id: str) -> list[Object]:
        """The cached pods of a job (all phases), by name."""
        owner = parse_external_id(external_id)
        return sorted(
            (
                pod
                for pod in self.informers["pods"].items()
                if (pod.get("metadata") or {}).get("namespace") == owner.namespace
                and _same_owner(owner_of(pod), owner)
            ),
            key=lambda pod: pod["metadata"]["name"],
        )


def _uid(obj: Object) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


def _ran_pinned(pin: Pin, pods: list[Object], template_spec: Mapping[str, Any]) -> bool:
    """Whether a pod of the run a pin is for is on one of its nodes (a pod being deleted
    may be the run's before it)."""
    return pin.in_force(template_spec) and any(
        actions.pod_active(p) and pod_node(p) in pin.nodes for p in pods
    )


def _same_owner(found: OwnerRef, wanted: OwnerRef) -> bool:
    return found.external_id == wanted.external_id


def kueue_installed(api: ApiClient) -> bool:
    """Whether the API server serves Kueue's API group (its CRDs are installed)."""
    try:
        response = api.call_api(
            KUEUE_GROUP_PATH,
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=(10.0, 10.0),
        )
        response.release_conn()
    except ApiException:
        return False
    except Exception as error:  # a hint only: never stop the connector for it
        logger.debug("could not look for Kueue: %r", error)
        return False
    return True


def create_kubernetes_connector(**options: Any) -> KubernetesConnector:
    """The registry's factory: ``options`` are :class:`KubernetesConnectorConfig` fields."""
    connector = KubernetesConnector(KubernetesConnectorConfig(**options))
    if kueue_installed(connector.api):
        logger.info(
            "Kueue is installed in cluster %s: --kind kueue also reports Kueue's admission, "
            "queues and reasons",
            connector.cluster,
        )
    return connector
