"""The saga steps the Kueue connector can run: for a job Kueue manages (it has a Workload),
Kueue's own levers (connectors.kueue.actions); for any other job, the Kubernetes
connector's steps (connectors.kubernetes.capabilities).

==================================  ==========================================================
step                                a job with a Workload
==================================  ==========================================================
resize(replicas)                    as on Kubernetes (services are not Kueue's)
hold / release                      ``deactivate`` / ``reactivate``
suspend / resume                    ``preempt_with_checkpoint`` / ``reactivate``
requeue(hold)                       with a resume pointer ``preempt_with_checkpoint``, else
                                    ``deactivate`` and wait until Kueue has stopped it; then
                                    ``reactivate`` unless ``hold``
start(nodes)                        ``reactivate``
cancel                              ``delete_job`` (the Workload goes with its Job)
submit(spec, name, hold)            create the Job suspended (Kueue admits it); with
                                    ``hold`` ``deactivate`` its Workload once it exists
withdraw(name)                      as on Kubernetes: ``delete_job``
check_arrival                       the Workload (queued, held, inadmissible), then once
                                    admitted the Job and its pods as on Kubernetes
==================================  ==========================================================

Kueue admits a Workload and the kube-scheduler places its pods, so the connector cannot
pin one: ``start(nodes)`` lets it be admitted wherever its flavors allow (the confirm that
follows says where it runs), a held requeue ignores ``nodes`` (a held job has no
placement), and a requeue that would have to run it on given nodes now is refused, as is
``exclude``. Reservations are not offered, as on Kubernetes.

``hold`` stops an admitted workload and its work is lost unless it was checkpointed;
``suspend`` keeps it: the Workload's pods must be able to resume, and a running one needs
the pointer of the checkpoint the saga's agent step took (``set_resume_pointer``, from
the executor). ``preempt_with_checkpoint``'s ``checkpoint`` callback answers with that
pointer — the saga has already checkpointed, the connector does not call an agent — and
refuses when there is none, before anything stops. A connector given the node agents'
URL (``node_agent_url``) asks the agent on the pod's node for a kubelet checkpoint instead
when a suspend comes without a pointer (connectors.kubernetes.node_agent); the pods
then resume from its checkpoint images (connectors.kubernetes.restore_webhook).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connectors.arrival import rejected
from connectors.base import ConnectorError
from connectors.kubernetes import actions as kube_actions
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.arrival import judge_job, judge_workload, ran_condition
from connectors.kubernetes.capabilities import KubernetesCapabilities
from connectors.kubernetes.node_agent import configured_agent_checkpoint
from connectors.kubernetes.pods import QUEUE_LABEL, OwnerRef, parse_external_id
from connectors.kueue import actions
from connectors.kueue.actions import Checkpoint
from wire.telemetry import SubmitSpec

if TYPE_CHECKING:
    from kubernetes.client import V1Job

    from connectors.kubernetes.informer import Object

# The stamp a held submit writes on the Workload it deactivates (``STOPPED_BY_STEP``).
HELD_BY_MOVE = "move-held:"


class KueueCapabilities(KubernetesCapabilities):
    """Steps of the Kueue connector: a mixin of ``KueueConnector`` (``workload_of``)."""

    if TYPE_CHECKING:

        def workload_of(self, external_id: str) -> Object | None: ...

    def hold(self, external_id: str) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            super().hold(external_id)
            return
        actions.deactivate(self.api, namespace=owner.namespace, workload=workload)

    def release(self, external_id: str) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            super().release(external_id)
            return
        actions.reactivate(self.api, namespace=owner.namespace, workload=workload)

    def suspend(self, external_id: str) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            super().suspend(external_id)
            return
        resume_from, step_key = self._take_pointer(external_id)
        if self._resent_after_release(owner, workload, step_key):
            return
        # Without a pointer handed over, the pod's node agent takes a kubelet checkpoint
        # when the connector is given one (node_agent_url), else the suspend is refused.
        by_agent = None if resume_from is not None else configured_agent_checkpoint(self.config)
        actions.preempt_with_checkpoint(
            self.api,
            namespace=owner.namespace,
            workload=workload,
            checkpoint=by_agent or _taken(owner, resume_from),
            step_key=step_key,
        )

    def resume(self, external_id: str) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            super().resume(external_id)
            return
        actions.reactivate(self.api, namespace=owner.namespace, workload=workload)

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            super().requeue(external_id, nodes=nodes, exclude=exclude, hold=hold)
            return
        resume_from, step_key = self._take_pointer(external_id)
        if exclude or (nodes and not hold):
            raise ConnectorError(
                f"cannot requeue {external_id} onto or away from given nodes: Kueue admits "
                "it and the scheduler places it",
                retryable=False,
            )
        namespace = owner.namespace
        if self._resent_after_release(owner, workload, step_key):
            return
        if resume_from is not None:
            actions.preempt_with_checkpoint(
                self.api,
                namespace=namespace,
                workload=workload,
                checkpoint=_taken(owner, resume_from),
                # A checkpoint was taken for this: pods that cannot resume from it would
                # restart from scratch while the control plane believes the work is kept.
                allow_restart=False,
                step_key=step_key,
            )
        else:
            # The restart a plan asked for under a policy that allows it.
            actions.deactivate(self.api, namespace=namespace, workload=workload, step_key=step_key)
            if not hold:
                # So that the reactivation queues it again instead of finding it still
                # admitted.
                actions.wait_stopped(
                    self.api,
                    namespace=namespace,
                    workload=workload,
                    job=actions.job_of(
                        actions.read_workload(self.api, namespace=namespace, workload=workload)
                    ),
                )
        if not hold:
            actions.reactivate(self.api, namespace=namespace, workload=workload)

    def start(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        replicas: int | None = None,
        gpus: dict[str, int] | None = None,
    ) -> None:
        owner, workload = self._workload(external_id)
        if workload is None:
            # A Job Kueue leaves alone, an elastic training one among them.
            super().start(external_id, nodes=nodes, replicas=replicas, gpus=gpus)
            return
        actions.reactivate(self.api, namespace=owner.namespace, workload=workload)

    # --- SupportsSubmit (connectors.kubernetes.moves) ---------------------------------------

    def job_to_create(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None,
        hold: bool,
        what: str,
    ) -> dict[str, Any]:
        """A Job Kueue will manage is created suspended, as Kueue's webhook would make it
        anyway: Kueue unsuspends it once admitted. It cannot be pinned (module docstring),
        so ``nodes`` (a running job's move) is refused before anything is created."""
        if nodes:
            raise ConnectorError(
                f"{what}: Kueue admits a job and the scheduler places it, so it cannot be "
                f"pinned to {','.join(nodes)}; a running job cannot move to a Kueue cluster",
                retryable=False,
            )
        job = super().job_to_create(spec, name=name, nodes=None, hold=hold, what=what)
        labels = job["metadata"]["labels"]
        if spec.scheduler is not self.kind and not labels.get(QUEUE_LABEL):
            if self.config.portable_queue is None:
                raise ConnectorError(
                    f"{what}: a job from another scheduler's portable form needs a LocalQueue "
                    "to queue in here; set portable_queue",
                    retryable=False,
                )
            labels[QUEUE_LABEL] = self.config.portable_queue
        if labels.get(QUEUE_LABEL):
            job["spec"]["suspend"] = True
        return job

    def after_submit(self, job: V1Job, *, name: str, hold: bool, what: str) -> None:
        """A held submit of a job Kueue manages deactivates its Workload (Kueue's hold: a
        ``release`` reactivates it), stamped with the move's name, once: a resent submit
        whose Workload carries the stamp leaves it alone — it may have been released since.
        Kueue may admit the Workload between its creation and the deactivation; the
        deactivation then stops it again (its pods, had any started, go)."""
        labels = job.metadata.labels or {}
        if not hold or not labels.get(QUEUE_LABEL):
            return
        external_id = OwnerRef("Job", job.metadata.namespace, job.metadata.name).external_id
        workload = _first_answer(
            f"the Workload of {external_id} ({what})", lambda: self.workload_of(external_id)
        )
        namespace, workload_name = job.metadata.namespace, str(workload["metadata"]["name"])
        stamp = f"{HELD_BY_MOVE}{name}"
        current = actions.read_workload(self.api, namespace=namespace, workload=workload_name)
        if actions.stopped_by(current, stamp):
            return
        actions.deactivate(self.api, namespace=namespace, workload=workload_name, step_key=stamp)

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: a moved Job Kueue manages is judged by its Workload first
        (queued, held, inadmissible: connectors.kubernetes.arrival), then, once admitted or
        finished, by the Job and its pods as on Kubernetes."""
        owner, workload = self._workload(external_id)
        if workload is None:
            return super().check_arrival(external_id)
        current = actions.read_workload(self.api, namespace=owner.namespace, workload=workload)
        settled = judge_workload(current, external_id)
        if settled is not None:
            return settled
        job = self.arrived_job(external_id)
        if actions.condition_true(current, "Finished") and ran_condition(job) is None:
            raise rejected(
                f"job {external_id}'s Workload {workload} finished before its Job ran "
                "(Kueue gave up on it)"
            )
        admitted = actions.condition_true(current, "Admitted")
        return judge_job(job, self.current_pods(job), external_id, admitted=admitted)

    # --- helpers ---------------------------------------------------------------------------

    def _resent_after_release(self, owner: OwnerRef, workload: str, step_key: str | None) -> bool:
        """A resend of a step that already stopped this Workload (its stamp, written with
        the deactivation) and after which it was let run again: nothing is left to do, and
        stopping it a second time would throw away the work done since (or restart it from
        the old checkpoint). An inactive stamped Workload is finished as usual: the actions
        skip what is done."""
        current = actions.read_workload(self.api, namespace=owner.namespace, workload=workload)
        return actions.stopped_by(current, step_key) and actions.is_active(current)

    def _workload(self, external_id: str) -> tuple[OwnerRef, str | None]:
        """The job's owner and the name of its Workload; None when Kueue does not manage it
        (a retryable error while a Job that Kueue will manage has no Workload yet)."""
        owner = parse_external_id(external_id)
        workload = self.workload_of(external_id)
        if workload is not None:
            return owner, str(workload["metadata"]["name"])
        if owner.kind == "Job":
            job = kube_actions.read_job(self.api, namespace=owner.namespace, job=owner.name)
            labels = job.metadata.labels or {}
            if labels.get(QUEUE_LABEL):
                raise ConnectorError(
                    f"job {external_id} is queued in Kueue (LocalQueue "
                    f"{labels[QUEUE_LABEL]}) but its Workload is not seen yet",
                    retryable=True,
                )
        return owner, None


def _first_answer(what: str, found: Callable[[], Object | None]) -> Object:
    """What ``found`` answers once it answers something; retryable after the settle time."""
    answer: list[Object] = []

    def done() -> bool:
        value = found()
        if value is not None:
            answer.append(value)
        return value is not None

    kube_actions.wait_until(what, done, kube_actions.SETTLE_TIMEOUT_S)
    return answer[-1]


def _taken(owner: OwnerRef, resume_from: str | None) -> Checkpoint:
    """``preempt_with_checkpoint``'s checkpoint callback: the saga's agent step has already
    checkpointed the pods, so this answers with its pointer, or refuses when it gave none."""

    def checkpoint(pods: list[PodOnNode]) -> str:
        if resume_from is None:
            where = ", ".join(f"{p.pod} on {p.node}" for p in pods)
            raise ConnectorError(
                f"cannot suspend {owner.external_id}: its running pods ({where}) would start "
                "over; the step carries no checkpoint to resume from (the saga's checkpoint "
                "step gives one)",
                retryable=False,
            )
        return resume_from

    return checkpoint
