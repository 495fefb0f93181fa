"""The saga steps the Kubernetes connector can run: the capability protocols of
connectors.base over the functions of connectors.kubernetes.actions.

What each step does to the object a job's external id names (``<namespace>/<kind>/<name>``,
connectors.kubernetes.pods):

==================================  ==========================================================
step                                plain Kubernetes
==================================  ==========================================================
resize(replicas)                    Deployment, StatefulSet: ``scale`` (``/scale``)
resize(replicas, leave)             Deployment, with the connector's ``pod_placement``:
(``resize_off``)                    ``resize_deployment_off`` — the pods leaving each
                                    named node marked with the lowest deletion cost,
                                    then ``scale``; StatefulSet refused (it drops its
                                    highest ordinals)
resize_job(nodes, replicas)         elastic Indexed Job (an elastic training job,
                                    connectors.kubernetes.pods): ``shrink_indexed_job``
                                    when the pods it keeps (the lower indexes) run where
                                    the plan keeps them; else ``restart_indexed_job``
                                    at the new size, pinned to ``nodes``
hold / release                      Job: ``suspend_job`` / ``resume_job``; a release with
                                    a resume pointer (a moved job's, at its target):
                                    ``recreate_job_pinned(nodes=None)`` with the pointer
suspend / resume                    Job: ``suspend_job_to_resume`` (the pods go, the template
                                    keeps the resume pointer) / ``resume_job``
requeue(nodes, hold)                Job: ``recreate_job_pinned`` to ``nodes`` with the
                                    pointer; with ``hold`` ``suspend_job_to_resume`` (pinned,
                                    left suspended); without nodes or pointer
                                    ``restart_job`` (suspend, then resume unless
                                    ``hold``; a resent step does not restart twice)
start(nodes)                        suspended Job: ``recreate_job_pinned(resume_from=None)``
                                    to ``nodes`` (its pointer kept), ``resume_job`` without
                                    nodes; a bare pod without nodes: nothing to do;
                                    with ``replicas``, a suspended elastic Indexed Job:
                                    ``restart_indexed_job`` (sized, pinned, let run)
restart_indexed_job, with the       each pod on the node the plan gives its index, not
connector's ``pod_placement``       only within ``nodes`` (connectors.kubernetes.pod_placement)
cancel                              Job: ``delete_job``; bare pod: ``delete_pod``
submit(spec, name, nodes, hold)     create the spec's Job, suspended when ``hold``, pinned
                                    to ``nodes`` (connectors.kubernetes.moves)
withdraw(name)                      delete the move's Job unless it ran to its end
check_arrival                       a moved Job's confirm: judged from the Job and its
                                    pods (connectors.kubernetes.arrival)
set_resume_pointer                  kept for the ``requeue``/``suspend``/``release`` that
                                    follows
drain / undrain (a node)            ``cordon`` / ``uncordon`` (patch nodes: the deployed
                                    role must allow it)
==================================  ==========================================================

Anything else is refused with a non-retryable :class:`ConnectorError` that says why (the
executor answers the step failed, not retried): other owners (JobSet, LeaderWorkerSet,
RayCluster) until their controllers are handled; ``exclude`` (Kubernetes pins to named
nodes, it cannot place "anywhere but"); moving or holding a bare pod — a requeue, or a
start that pins one that is not bound yet. A move of a bare pod is delete-then-create,
and if the connector failed between the two (a crash, a timeout whose retry finds the pod
gone) nothing would ever recreate it: its spec and its work would be lost. Work that
must move runs as a Job, whose controller keeps the pod template.
Not offered at all, so the executor refuses the step itself: ``reserve``/``unreserve`` —
Kubernetes has nothing like a Slurm reservation that keeps free GPUs for one job — and
``update_node_count``. A malformed or unknown external id is non-retryable (the API
server's 404), like Slurm's.

**Work is never lost silently.** Suspending or moving a running Job deletes its pods, so
they must be able to resume (``shaper.io/checkpointable: "true"`` and
``SHAPER_RESUME_FROM`` declared from the annotation, connectors.kubernetes.actions), and
a running Job must have somewhere to resume from: the pointer of the checkpoint this
step's agent step took (``set_resume_pointer``, which the executor calls before every
requeue and suspend, None clearing what an earlier step left). A pointer the Job carries
from an earlier move does not count for a running Job — its pods have run on since that
checkpoint — so without this step's own the step is refused. A held Job (suspended, no
pod left) has nothing to lose and keeps the pointer it carries. A requeue without a pin
is the scheduler's restart that the plan asked for under a policy that allows it (the
saga's preemption of a job that cannot checkpoint), so it goes ahead. The connector
does not call a node agent here: the saga runs the agent's checkpoint step first and
passes on what it reported (only the Kueue connector, when given ``node_agent_url``, asks
a pod's node agent for a kubelet checkpoint itself: connectors.kueue.capabilities).

Every pin these steps write lasts one run (connectors.kubernetes.pins): the steps that
suspend, resume or pin a Job hold the connector's pins lock, which the upkeep's lift of a
stale pin (connectors.kubernetes.actions.lift_stale_pin) also takes.

The Kueue connector (connectors.kueue.capabilities) overrides these for the jobs Kueue
manages: Kueue owns their ``spec.suspend``, and the functions here refuse them.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

from kubernetes import client

from connectors.base import ConnectorError
from connectors.kubernetes import actions, pod_gates
from connectors.kubernetes.moves import KubernetesMoves
from connectors.kubernetes.pods import STOPPED_BY_STEP, OwnerRef, parse_external_id

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from connectors.kubernetes.config import KubernetesConnectorConfig
    from connectors.kubernetes.informer import Object

logger = logging.getLogger(__name__)

SCALABLE: dict[str, Literal["deployment", "statefulset"]] = {
    "Deployment": "deployment",
    "StatefulSet": "statefulset",
}
ENDED_CONDITIONS = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")


P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound="KubernetesCapabilities")


def _holding_pins(method: Callable[Concatenate[C, P], R]) -> Callable[Concatenate[C, P], R]:
    """Run a step that suspends, resumes or pins a Job under the connector's pins lock,
    which the upkeep's lift of a stale pin (actions.lift_stale_pin) also holds: a lift
    suspends and resumes the Job, and must not undo a hold or a start made meanwhile."""

    def holding(self: C, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.pins_lock:
            return method(self, *args, **kwargs)

    return functools.update_wrapper(holding, method)  # type: ignore[return-value]


class KubernetesCapabilities(KubernetesMoves):
    """Steps of the Kubernetes connector: a mixin of ``KubernetesConnector`` (it needs the
    connector's ``api``, and ``owner_object`` for the Kueue variant); ``submit`` and
    ``withdraw`` are :class:`KubernetesMoves`'."""

    if TYPE_CHECKING:
        api: ApiClient
        cluster: str
        config: KubernetesConnectorConfig

        def owner_object(self, external_id: str) -> Object | None: ...

    # Held by the steps that suspend, resume or pin a Job and by the upkeep's lifts.
    pins_lock: threading.RLock

    # external id → the pointer and the step key the executor handed over, until the step's
    # action takes them.
    _resume_pointers: dict[str, str | None]
    _step_keys: dict[str, str]

    # --- what the executor hands over (SupportsResumePointer, SupportsStepKey) -------------

    def set_resume_pointer(self, external_id: str, resume_from: str | None) -> None:
        parse_external_id(external_id)
        self._handed("_resume_pointers")[external_id] = resume_from

    def set_step_key(self, external_id: str, step_key: str) -> None:
        parse_external_id(external_id)
        self._handed("_step_keys")[external_id] = step_key

    def _handed(self, name: str) -> dict[str, Any]:
        handed: dict[str, Any] | None = getattr(self, name, None)
        if handed is None:
            handed = {}
            setattr(self, name, handed)
        return handed

    def _take_pointer(self, external_id: str) -> tuple[str | None, str | None]:
        """The step's resume pointer and idempotency key (None: none handed over)."""
        pointer: str | None = self._handed("_resume_pointers").pop(external_id, None)
        key: str | None = self._handed("_step_keys").pop(external_id, None)
        return pointer, key

    # --- SupportsResize --------------------------------------------------------------------

    def resize(self, external_id: str, *, replicas: int) -> None:
        owner = parse_external_id(external_id)
        kind = SCALABLE.get(owner.kind)
        if kind is None:
            raise _cannot("resize", owner, "only Deployments and StatefulSets have replicas to set")
        actions.scale(
            self.api, namespace=owner.namespace, kind=kind, name=owner.name, replicas=replicas
        )

    # --- SupportsReplicaMoves --------------------------------------------------------------

    def resize_off(self, external_id: str, *, replicas: int, leave: dict[str, int]) -> None:
        """A Deployment to ``replicas``, ``leave[node]`` of its replicas taken off each named
        node (``actions.resize_deployment_off``; without ``leave``, a plain ``resize``). Only
        with the connector's ``pod_placement``: deploy/kubernetes/components/pod-placement
        grants the ``patch pods`` that marking the leaving pods needs, and its report says
        so (``replicas_movable``, connectors.kubernetes.pods)."""
        owner = parse_external_id(external_id)
        if owner.kind == "StatefulSet":
            raise _cannot(
                "resize",
                owner,
                "a StatefulSet drops its highest ordinals; Shaper cannot choose which "
                "replicas leave",
            )
        if owner.kind != "Deployment":
            raise _cannot("resize", owner, "only a Deployment's replicas can be moved off nodes")
        if not leave:
            self.resize(external_id, replicas=replicas)
            return
        if not self.config.pod_placement:
            raise _cannot(
                "resize",
                owner,
                "moving replicas off nodes needs the connector's pod_placement "
                "(deploy/kubernetes/components/pod-placement grants patch on pods)",
            )
        actions.resize_deployment_off(
            self.api,
            namespace=owner.namespace,
            deployment=owner.name,
            replicas=replicas,
            leave=leave,
        )

    # --- SupportsHold ----------------------------------------------------------------------

    @_holding_pins
    def hold(self, external_id: str) -> None:
        owner = self._job("hold", external_id)
        actions.suspend_job(self.api, namespace=owner.namespace, job=owner.name)

    @_holding_pins
    def release(self, external_id: str) -> None:
        """Let a held Job run; with a resume pointer handed over (a running job's move,
        released at its target once its image is staged) its template carries the pointer
        first, so its pods resume from there."""
        resume_from: str | None = self._handed("_resume_pointers").pop(external_id, None)
        owner = self._job("release", external_id)
        if resume_from is None:
            actions.resume_job(self.api, namespace=owner.namespace, job=owner.name)
            return
        actions.recreate_job_pinned(
            self.api,
            namespace=owner.namespace,
            job=owner.name,
            nodes=None,
            resume_from=resume_from,
        )

    # --- SupportsSuspend -------------------------------------------------------------------

    @_holding_pins
    def suspend(self, external_id: str) -> None:
        resume_from, _ = self._take_pointer(external_id)
        owner = self._job("suspend", external_id)
        self._refuse_a_fresh_start("suspend", owner, resume_from)
        actions.suspend_job_to_resume(
            self.api, namespace=owner.namespace, job=owner.name, resume_from=resume_from
        )

    @_holding_pins
    def resume(self, external_id: str) -> None:
        owner = self._job("resume", external_id)
        actions.resume_job(self.api, namespace=owner.namespace, job=owner.name)

    # --- SupportsRequeue -------------------------------------------------------------------

    @_holding_pins
    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        resume_from, step_key = self._take_pointer(external_id)
        owner = parse_external_id(external_id)
        if exclude:
            raise _cannot(
                "requeue",
                owner,
                f"Kubernetes pins to named nodes and cannot keep a job off {','.join(exclude)}",
            )
        pin = nodes or None
        if owner.kind == "Pod":
            raise _cannot("hold" if hold else "requeue", owner, _BARE_POD)
        if owner.kind != "Job":
            raise _cannot("requeue", owner, _JOBS_ONLY)
        namespace, job = owner.namespace, owner.name
        if pin is None and resume_from is None:
            # The restart a plan asked for under a policy that allows it: nothing to keep.
            actions.restart_job(
                self.api, namespace=namespace, job=job, step_key=step_key, hold=hold
            )
            return
        if pin is not None:
            # A pin is a move (the saga pins only jobs it checkpointed): the work must go on.
            self._refuse_a_fresh_start("move", owner, resume_from)
        move = actions.suspend_job_to_resume if hold else actions.recreate_job_pinned
        move(
            self.api,
            namespace=namespace,
            job=job,
            nodes=pin,
            resume_from=resume_from,
            allow_restart=pin is None,
        )

    # --- SupportsStart ---------------------------------------------------------------------

    @_holding_pins
    def start(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        replicas: int | None = None,
        gpus: dict[str, int] | None = None,  # the pods land where they fit on ``nodes``
    ) -> None:
        """Start a held (suspended) Job, pinned to ``nodes`` when given, resuming from the
        pointer it carries — an elastic Indexed Job at ``replicas`` pods when given
        (``restart_indexed_job``); a Job that is not suspended is left to the scheduler
        (the confirm that follows says where it runs), as is a bare pod already bound or
        started without nodes. Pinning a bare pod that is not bound yet is refused
        (module docstring)."""
        owner = parse_external_id(external_id)
        pin = nodes or None
        if owner.kind == "Pod":
            if pin is not None and not self._pod_bound(owner):
                raise _cannot("start", owner, _BARE_POD)
            return
        if owner.kind != "Job":
            raise _cannot("start", owner, _JOBS_ONLY)
        current = self._live_job("start", owner)
        if not current.spec.suspend:
            return
        if replicas and pin is not None and actions.elastic_job_size(current) is not None:
            self._restart_indexed(owner, replicas=replicas, nodes=pin, gpus=gpus, step_key=None)
            return
        if pin is None:
            actions.resume_job(self.api, namespace=owner.namespace, job=owner.name)
            return
        actions.recreate_job_pinned(
            self.api, namespace=owner.namespace, job=owner.name, nodes=pin, resume_from=None
        )

    # --- SupportsJobResize -----------------------------------------------------------------

    @_holding_pins
    def resize_job(
        self,
        external_id: str,
        *,
        nodes: list[str],
        replicas: int,
        gpus: dict[str, int] | None = None,
    ) -> None:
        """An elastic training job (an elastic Indexed Job, connectors.kubernetes.pods)
        to ``replicas`` pods on ``nodes`` (``gpus``: the plan's GPUs on each).

        Shrunk in place when the pods it keeps run where the plan keeps them: Kubernetes
        keeps the lower indexes and deletes the rest, so the pods of indexes below
        ``replicas`` must be on ``nodes``, all of them, with the GPUs ``gpus`` gives each
        (``actions.shrink_indexed_job``: no restart). Otherwise — growth, or a shrink that
        keeps other pods — it is restarted at the new size pinned to ``nodes``
        (``actions.restart_indexed_job``, stamped with the step's key) and resumes from its
        own checkpoint. A resend finds it at that size there, or its stamp, and leaves it.
        A suspended Job that this step did not suspend is refused (it is held: a resize
        would let it run)."""
        owner = self._job("resize", external_id)
        _, step_key = self._take_pointer(external_id)
        what = f"resize to {replicas} pod(s) on {','.join(nodes)}"
        if not nodes or replicas < 1:
            raise _cannot("resize", owner, f"{what}: no node or no pod")
        current = self._live_job("resize", owner)
        size = actions.indexed_size(current, f"{what} {external_id}")
        stamp = (current.metadata.annotations or {}).get(STOPPED_BY_STEP)
        if current.spec.suspend and (step_key is None or stamp != step_key):
            # Held since the plan was made (a hold, an operator): a plan's start sizes a
            # held Job; a resize would let it run.
            raise _cannot("resize", owner, f"{what}: it is suspended")
        if not current.spec.suspend:
            placed = actions.indexed_pods(self.api, current)
            kept = [placed[i] for i in range(replicas) if i in placed]
            if len(kept) == replicas and _as_planned(kept, nodes, gpus):
                if size == replicas:
                    return  # it runs there already
                if size > replicas:
                    actions.shrink_indexed_job(
                        self.api, namespace=owner.namespace, job=owner.name, replicas=replicas
                    )
                    return
        self._restart_indexed(
            owner, replicas=replicas, nodes=list(nodes), gpus=gpus, step_key=step_key
        )

    def _restart_indexed(
        self,
        owner: OwnerRef,
        *,
        replicas: int,
        nodes: list[str],
        gpus: dict[str, int] | None,
        step_key: str | None,
    ) -> None:
        """``actions.restart_indexed_job``, each pod on its own node when it may be
        (:meth:`_pods_on`), and then those pods let go to their nodes."""
        pods_on = self._pods_on(owner.namespace, gpus)
        actions.restart_indexed_job(
            self.api,
            namespace=owner.namespace,
            job=owner.name,
            replicas=replicas,
            nodes=nodes,
            step_key=step_key,
            pods_on=pods_on,
        )
        if pods_on is None:
            return
        try:
            pod_gates.let_pods_go(
                self.api,
                namespace=owner.namespace,
                job=owner.name,
                replicas=replicas,
                timeout_s=actions.SETTLE_TIMEOUT_S,
            )
        except ConnectorError as error:
            if not error.retryable:  # refused: gate no more Jobs
                self._guard = pod_gates.Guard.missing
            raise

    def _pods_on(self, namespace: str, gpus: dict[str, int] | None) -> dict[str, int] | None:
        """The plan's GPUs per node when each pod goes on its own node: the connector's
        ``pod_placement``, the right to patch pods in the namespace (else the pods would
        wait on a gate nobody may lift) and no guard found missing. Else None: the pods
        are pinned to the nodes as a set."""
        if not self.config.pod_placement or gpus is None:
            return None
        if self._guard == pod_gates.Guard.missing:
            return None
        if not pod_gates.may_patch_pods(self.api, namespace):
            logger.warning(
                "pod_placement is on but this connector may not patch pods in %s "
                "(deploy/kubernetes/components/pod-placement): pods are pinned to the "
                "plan's nodes as a set",
                namespace,
            )
            return None
        if self._guard is not pod_gates.Guard.held:
            found = pod_gates.check_guard(self.api, namespace)
            if found is not pod_gates.Guard.unknown:
                self._guard = found
            if found is not pod_gates.Guard.held:
                logger.info(
                    "pods of a Job in %s pinned to the plan's nodes as a set: the admission "
                    "policy holding this connector is %s",
                    namespace,
                    "missing" if found is pod_gates.Guard.missing else "not confirmed yet",
                )
                return None
        return gpus

    # What pod_gates.check_guard found: held (for the life of the process), missing (no
    # gating until a restart), or None (not confirmed yet). Set on the instance.
    _guard: pod_gates.Guard | None = None

    def _live_job(self, step: str, owner: OwnerRef) -> client.V1Job:
        """The Job as the API server has it; one that has ended is refused."""
        current = actions.read_job(self.api, namespace=owner.namespace, job=owner.name)
        ended = [
            c.type
            for c in current.status.conditions or []
            if c.type in ENDED_CONDITIONS and c.status == "True"
        ]
        if ended:
            raise _cannot(step, owner, f"it has ended ({ended[0]})")
        return current

    # --- SupportsCancel --------------------------------------------------------------------

    def cancel(self, external_id: str) -> None:
        owner = parse_external_id(external_id)
        if owner.kind == "Job":
            actions.delete_job(self.api, namespace=owner.namespace, job=owner.name)
        elif owner.kind == "Pod":
            actions.delete_pod(self.api, namespace=owner.namespace, pod=owner.name)
        else:
            raise _cannot("cancel", owner, "its owner is the site's to delete, not Shaper's")

    # --- SupportsDrain ---------------------------------------------------------------------

    def drain_node(self, node: str, *, reason: str = "drained by Shaper") -> None:
        """``kubectl cordon``: the node's pods keep running (Kubernetes keeps no reason on a
        cordon; the action's row does). Idempotent."""
        actions.cordon(self.api, node=node)

    def undrain_node(self, node: str) -> None:
        """``kubectl uncordon``. Idempotent. (A node tainted NoSchedule stays draining in
        telemetry: the taint is the site's, not Shaper's to lift.)"""
        actions.uncordon(self.api, node=node)

    # --- helpers ---------------------------------------------------------------------------

    def _job(self, step: str, external_id: str) -> OwnerRef:
        owner = parse_external_id(external_id)
        if owner.kind != "Job":
            raise _cannot(step, owner, _JOBS_ONLY)
        return owner

    def _pod_bound(self, owner: OwnerRef) -> bool:
        core = client.CoreV1Api(self.api)
        pod = actions.call(
            "get",
            f"pods {owner.name} in {owner.namespace}",
            lambda: core.read_namespaced_pod(
                owner.name, owner.namespace, _request_timeout=actions.REQUEST_TIMEOUT_S
            ),
        )
        return bool(pod.spec.node_name)

    def _refuse_a_fresh_start(self, step: str, owner: OwnerRef, resume_from: str | None) -> None:
        """Refuse to stop a running Job without this step's own pointer: a pointer its
        template carries from an earlier move is older than the work its pods did since.
        (Whether its pods *can* resume is the action's own check.)"""
        if resume_from is not None:
            return
        current = actions.read_job(self.api, namespace=owner.namespace, job=owner.name)
        running = not current.spec.suspend or bool(current.status.active)
        if running:
            raise _cannot(
                step,
                owner,
                "its pods would start over: the step carries no checkpoint to resume from "
                "(the saga's checkpoint step gives one), and a pointer the Job carries from "
                "an earlier move is older than the work done since",
            )


_JOBS_ONLY = "the Kubernetes connector acts on batch/v1 Jobs and bare pods only"
_BARE_POD = (
    "a bare pod is never moved: nothing would recreate it if the connector failed between "
    "deleting it and creating it again; run the workload as a Job"
)


def _as_planned(kept: list[tuple[str, int]], nodes: list[str], gpus: dict[str, int] | None) -> bool:
    """Whether pods (node, GPUs) are on ``nodes``, all of them, and — when the plan says
    how many GPUs go on each — with those GPUs."""
    held: dict[str, int] = {}
    for node, count in kept:
        held[node] = held.get(node, 0) + count
    if set(held) != set(nodes):
        return False
    return gpus is None or all(held[node] == gpus.get(node, held[node]) for node in held)


def _cannot(step: str, owner: OwnerRef, why: str) -> ConnectorError:
    return ConnectorError(f"cannot {step} {owner.external_id}: {why}", retryable=False)
