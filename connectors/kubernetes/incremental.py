"""The Kubernetes connector's reports, kept current change by change instead of rebuilt.

``read_state`` used to translate every cache whole on each call: at 10,000 pods that is
seconds of CPU for a change of one pod. :class:`JobReports` keeps, between calls, every
``JobReport`` by external id and every ``NodeReport`` by node name, with the indexes that
say which of them a change of one object can alter, and on each :meth:`JobReports.update`
applies what the informers changed since the previous one (``Informer.drain``) and
translates again only what those changes touched — with the very functions the whole
translation uses (connectors.kubernetes.pods, connectors.kubernetes.nodes).

**The invariant.** After ``update()`` the reports equal what the whole translation
(``KubernetesConnector.rebuild_state``) gives for the objects the update drained: every
report is a pure function of a few inputs, and every change marks dirty each report
whose inputs it touched, in the old version of the object and in the new:

* a **job** (owner external id) depends on its group — the watched owner object of that id
  and the pods whose owner it is, in name order (``pods.arrange``) — on the states of the
  nodes those pods are bound to (allocations skip nodes unknown or down), on the priority
  classes and on the connector's options. So: a pod change dirties the owner it had and
  the owner it has; an owner object's change dirties its id; a node whose *state* changed
  (appeared, vanished, up/draining/down) dirties the owners of the live pods bound to
  it; any priority class change dirties every job (rare: cluster configuration).
* a **node** depends on its Node object and on the GPUs that live pods bound to it
  request (held, counted over all namespaces): a change of the node, or of a pod bound
  to it before or after, dirties it.
* the Kueue connector (connectors.kueue.connector) adds: a job depends on its Workload
  (the last by namespace/name when several name the same owner) and on the queues; a
  Workload change dirties its owner's id, old and new; a LocalQueue, ClusterQueue or
  ResourceFlavor change dirties every job. A Workload's owner with neither pods nor a
  watched object is a job too.

Informers drain one at a time, so one update may see a pod newer than its node — as the
whole translation, reading the caches one after the other, does too; the next update
catches up, since a change drained is applied and a change after a drain waits for the
next. A translation that raises (an object the API server should never have served)
drops every index: the next update starts again from the whole caches.

Reports are frozen pydantic models and shared between calls (the runner's delta compares
them by value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from connectors.kubernetes.informer import Key, Object
from connectors.kubernetes.nodes import node_report, node_state
from connectors.kubernetes.pods import (
    JobGroup,
    OwnerRef,
    TranslationContext,
    arrange,
    job_report,
    owner_of,
    pod_gpus,
    pod_live,
    pod_node,
    priorities,
)
from wire.telemetry import JobReport, NodeReport, NodeState

if TYPE_CHECKING:
    from connectors.kubernetes.connector import KubernetesConnector

Changes = dict[str, tuple[bool, dict[Key, Object | None]]]


def complete(
    drained: tuple[bool, dict[Key, Object | None]], known: Callable[[], Iterable[Key]]
) -> dict[Key, Object | None]:
    """A drain as changes per key: after a list (the whole cache), the ``known()`` keys
    that it lacks are deletions."""
    replaced, objects = drained
    if replaced:
        for key in known():
            objects.setdefault(key, None)
    return objects


def key_order(key: Key) -> tuple[str, str]:
    return key[0] or "", key[1]


class JobReports:
    """The reports of one connector, updated from its informers' changes (see the module
    docstring); subclasses add collections through :meth:`more_changes`,
    :meth:`more_ids` and :meth:`report`."""

    def __init__(self, connector: KubernetesConnector, owner_collections: Mapping[str, str]):
        self.connector = connector
        self.config = connector.config
        # Owner kind → the informer of its objects.
        self.owner_collections = dict(owner_collections)
        self.wanted = frozenset(self.config.namespaces)
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next update reads every cache whole."""
        self.whole = True
        # Nodes, by name.
        self.node_objects: dict[str, Object] = {}
        self.node_states: dict[str, NodeState] = {}
        self.node_reports: dict[str, NodeReport] = {}
        # GPUs held per node, by live bound pods of any namespace; each such pod's share.
        self.held: dict[str, int] = {}
        self.bindings: dict[Key, tuple[str, int]] = {}
        self.bound: dict[str, set[Key]] = {}  # node → its live bound pods
        # Groups: each pod's owner id (pods of wanted namespaces), the pods of each owner,
        # and the watched owner objects by id (and by kind and key, for deletions).
        self.pod_owner: dict[Key, str] = {}
        self.members: dict[str, dict[Key, Object]] = {}
        self.owner_objects: dict[str, tuple[OwnerRef, Object]] = {}
        self.owner_keys: dict[str, dict[Key, str]] = {kind: {} for kind in self.owner_collections}
        self.priority_classes: dict[str, int] = {}
        self.default_priority = 0
        self.reports: dict[str, JobReport] = {}
        self.nodes_out: list[NodeReport] = []
        self.jobs_out: list[JobReport] = []

    # --- hooks -----------------------------------------------------------------------------

    def more_changes(self, changes: Changes, dirty: set[str]) -> bool:
        """Apply the changes of a subclass's collections, adding the ids they touch to
        ``dirty``; True when every job must be translated again."""
        return False

    def more_ids(self) -> Iterable[str]:
        """Ids that are jobs without pods or a watched owner object."""
        return ()

    def report(
        self, external_id: str, group: JobGroup | None, context: TranslationContext
    ) -> JobReport | None:
        return job_report(group, context) if group is not None else None

    # --- the update ------------------------------------------------------------------------

    def update(self) -> tuple[list[NodeReport], list[JobReport]]:
        """Apply what changed since the previous update; the nodes and jobs, each sorted."""
        try:
            self._update()
        except BaseException:
            self.reset()
            raise
        return list(self.nodes_out), list(self.jobs_out)

    def _update(self) -> None:
        whole, self.whole = self.whole, False
        changes: Changes = {
            name: informer.drain(whole=whole) for name, informer in self.connector.informers.items()
        }
        dirty_jobs: set[str] = set()
        dirty_nodes: set[str] = set()
        state_changed = self._apply_nodes(changes["nodes"], dirty_nodes)
        self._apply_pods(changes["pods"], dirty_jobs, dirty_nodes)
        for name in state_changed:
            for key in self.bound.get(name, ()):
                owner = self.pod_owner.get(key)
                if owner is not None:
                    dirty_jobs.add(owner)
        for kind, name in self.owner_collections.items():
            self._apply_owners(kind, changes[name], dirty_jobs)
        everything = whole
        replaced, classes = changes["priorityclasses"]
        if replaced or classes:
            self.priority_classes, self.default_priority = priorities(
                self.connector.informers["priorityclasses"].items()
            )
            everything = True
        everything = self.more_changes(changes, dirty_jobs) or everything
        if everything:
            dirty_jobs.update(self.reports, self.members, self.owner_objects, self.more_ids())
        self._translate_nodes(dirty_nodes)
        self._translate_jobs(dirty_jobs)

    def _apply_nodes(
        self, drained: tuple[bool, dict[Key, Object | None]], dirty: set[str]
    ) -> set[str]:
        state_changed: set[str] = set()
        known = lambda: [(None, name) for name in self.node_objects]  # noqa: E731
        for (_, name), node in complete(drained, known).items():
            before = self.node_states.get(name)
            if node is None:
                self.node_objects.pop(name, None)
                self.node_states.pop(name, None)
            else:
                self.node_objects[name] = node
                self.node_states[name] = node_state(node, ignored_taints=self.config.ignored_taints)
            dirty.add(name)
            if self.node_states.get(name) != before:
                state_changed.add(name)
        return state_changed

    def _hold(self, node: str, gpus: int) -> None:
        total = self.held.get(node, 0) + gpus
        if total:
            self.held[node] = total
        else:
            self.held.pop(node, None)

    def _apply_pods(
        self,
        drained: tuple[bool, dict[Key, Object | None]],
        dirty_jobs: set[str],
        dirty_nodes: set[str],
    ) -> None:
        known = lambda: set(self.bindings) | set(self.pod_owner)  # noqa: E731
        for key, pod in complete(drained, known).items():
            binding = self.bindings.pop(key, None)
            if binding is not None:
                node, gpus = binding
                self._hold(node, -gpus)
                on_node = self.bound[node]
                on_node.discard(key)
                if not on_node:
                    del self.bound[node]
                dirty_nodes.add(node)
            owner = self.pod_owner.pop(key, None)
            if owner is not None:
                members = self.members[owner]
                del members[key]
                if not members:
                    del self.members[owner]
                dirty_jobs.add(owner)
            if pod is None:
                continue
            node_name = pod_node(pod)
            if node_name and pod_live(pod):
                gpus = pod_gpus(pod)
                self.bindings[key] = (node_name, gpus)
                self._hold(node_name, gpus)
                self.bound.setdefault(node_name, set()).add(key)
                dirty_nodes.add(node_name)
            ref = owner_of(pod)
            if self.wanted and ref.namespace not in self.wanted:
                continue
            owner = ref.external_id
            self.pod_owner[key] = owner
            self.members.setdefault(owner, {})[key] = pod
            dirty_jobs.add(owner)

    def _apply_owners(
        self, kind: str, drained: tuple[bool, dict[Key, Object | None]], dirty: set[str]
    ) -> None:
        keys = self.owner_keys[kind]
        for key, obj in complete(drained, lambda: list(keys)).items():
            before = keys.pop(key, None)
            if before is not None:
                del self.owner_objects[before]
                dirty.add(before)
            if obj is None:
                continue
            namespace = key[0] or "default"
            if self.wanted and namespace not in self.wanted:
                continue
            owner = OwnerRef(kind, namespace, key[1])
            keys[key] = owner.external_id
            self.owner_objects[owner.external_id] = (owner, obj)
            dirty.add(owner.external_id)

    def group(self, external_id: str) -> JobGroup | None:
        """The group of an id as ``pods.group_pods`` makes it; None when it has none."""
        entry = self.owner_objects.get(external_id)
        members = self.members.get(external_id)
        if entry is None and not members:
            return None
        pods = list(members.values()) if members else []
        if entry is not None:
            return arrange(JobGroup(entry[0], entry[1], pods))
        return arrange(JobGroup(owner_of(pods[0]), None, pods))

    def context(self) -> TranslationContext:
        return TranslationContext(
            node_states=self.node_states,
            priority_classes=self.priority_classes,
            default_priority=self.default_priority,
            gpu_model_aliases=self.config.gpu_model_aliases,
            include_cpu_only=self.config.include_cpu_only,
            submit_spec=self.connector.submit_spec_reader(),
            replica_moves=self.config.pod_placement,
        )

    def _translate_nodes(self, dirty: set[str]) -> None:
        if not dirty:
            return
        for name in dirty:
            node = self.node_objects.get(name)
            if node is None:
                self.node_reports.pop(name, None)
                continue
            self.node_reports[name] = node_report(
                node,
                gpus_held=self.held.get(name, 0),
                aliases=self.config.gpu_model_aliases,
                default_gpu_model=self.config.default_gpu_model,
                ignored_taints=self.config.ignored_taints,
            )
        self.nodes_out = [self.node_reports[name] for name in sorted(self.node_reports)]

    def _translate_jobs(self, dirty: set[str]) -> None:
        if not dirty:
            return
        context = self.context()
        for external_id in dirty:
            report = self.report(external_id, self.group(external_id), context)
            if report is None:
                self.reports.pop(external_id, None)
            else:
                self.reports[external_id] = report
        self.jobs_out = [self.reports[external_id] for external_id in sorted(self.reports)]
