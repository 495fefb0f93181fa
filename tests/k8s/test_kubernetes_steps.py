"""The saga's scheduler-level steps on the Kubernetes and Kueue connectors, through
``ConnectorStepExecutor`` (what the connector's action worker runs), against the real
control plane and Kueue of the tests (see conftest): the connectors' capabilities
(connectors.kubernetes.capabilities, connectors.kueue.capabilities) as the API server, the
controllers, Kueue and the scheduler carry them out, and ``confirm`` reading them back
through the connector's own telemetry."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from connectors.actions import ConnectorStepExecutor
from connectors.kubernetes import actions
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pods import RESUME_FROM, RESUME_FROM_ENV
from connectors.kueue import actions as kueue_actions
from connectors.kueue.connector import KueueConnector
from tests.k8s.conftest import GPUS_PER_NODE, NODES, K8sCluster, Kube, wait_for
from tests.k8s.objects import (
    admitted,
    bare_pod,
    elastic_training_job,
    gpu_job,
    gpu_pods_anywhere,
    gpu_queues,
    inference_deployment,
    resolved_env,
    running_pods,
)
from wire.steps import Outcome, StepReport, StepRequest
from wire.telemetry import JobReport

pytestmark = pytest.mark.slow

CLUSTER = "k8s-steps"
# What the saga's checkpoint step reports as the image (agent.backends.base.CheckpointImage),
# of which the connector passes on the directory.
IMAGE_DIR = "/var/lib/shaper/images/train/generation-1"


class Steps:
    """Builds steps as the saga sends them and runs them on the connector's executor."""

    def __init__(self, executor: ConnectorStepExecutor) -> None:
        self.executor = executor
        self._action_ids = itertools.count(1)

    def request(self, step: str, workload_id: str, **args: Any) -> StepRequest:
        return StepRequest(
            action_id=next(self._action_ids),
            key=f"{step}:{uuid.uuid4().hex[:8]}",
            step=step,
            workload_id=workload_id,
            args=args,
        )

    def run(self, step: str, workload_id: str, **args: Any) -> StepReport:
        return self.executor.run(self.request(step, workload_id, **args))

    def until_ok(self, step: str, workload_id: str, **args: Any) -> StepReport:
        """A step resent under its key while it answers "not yet" (a retryable failure),
        as the control plane polls a confirm."""
        request = self.request(step, workload_id, **args)
        deadline = time.monotonic() + 60
        while True:
            report = self.executor.run(request)
            if report.ok:
                return report
            assert report.retryable, report.error
            assert time.monotonic() < deadline, f"{step} of {workload_id}: {report.error}"
            time.sleep(0.2)


@pytest.fixture
def steps_on(
    k8s_cluster: K8sCluster, kube: Kube, tmp_path: Path
) -> Iterator[Callable[[type[KubernetesConnector]], Steps]]:
    """``steps_on(KubernetesConnector or KueueConnector)``: a connector watching the
    test's namespace, behind an executor journalling in a fresh state directory."""
    connectors: list[KubernetesConnector] = []

    def make(kind: type[KubernetesConnector]) -> Steps:
        config = KubernetesConnectorConfig(
            cluster=CLUSTER, kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
        )
        connector = kind(config)
        connectors.append(connector)
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        return Steps(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path))

    yield make
    for connector in connectors:
        connector.close()


def kwok_nodes(kube: Kube) -> list[str]:
    return sorted(n.metadata.name for n in kube.core.list_node(label_selector="type=kwok").items)


def pod_running(kube: Kube, name: str) -> client.V1Pod | None:
    pod = kube.core.read_namespaced_pod(name, kube.namespace)
    return pod if pod.status.phase == "Running" and pod.spec.node_name else None


def held_gpus(job: JobReport) -> int:
    return sum(a.gpu_count or len(a.gpu_indices) for a in job.allocations)


def replicas_ready(kube: Kube, name: str, want: int) -> bool:
    status = client.AppsV1Api(kube.api).read_namespaced_deployment(name, kube.namespace).status
    return (status.ready_replicas or 0) == want and (status.replicas or 0) == want


def test_resize_scales_an_elastic_deployment_up_and_down_once_per_key(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KubernetesConnector)
    apps = client.AppsV1Api(kube.api)
    apps.create_namespaced_deployment(kube.namespace, inference_deployment("llm", replicas=1))
    service = f"{kube.namespace}/deployment/llm"
    wait_for("llm to have 1 ready replica", lambda: replicas_ready(kube, "llm", 1))

    up = steps.request("resize", service, replicas=3)
    report = steps.executor.run(up)
    assert report.ok and report.outcome is Outcome.executed, report.error
    assert report.result["replicas"] == 3
    wait_for("llm to scale up to 3", lambda: replicas_ready(kube, "llm", 3))
    # The connector's telemetry sees the service at its new size, holding 3 GPUs.
    connector = steps.executor.connector

    def reported() -> bool:
        job = next((j for j in connector.read_state().jobs if j.external_id == service), None)
        return job is not None and job.replicas == 3 and held_gpus(job) == 3

    wait_for("telemetry of llm at 3 replicas", reported)

    down = steps.run("resize", service, replicas=1)
    assert down.ok, down.error
    wait_for("llm to scale down to 1", lambda: replicas_ready(kube, "llm", 1))

    # The control plane's resend of the first step is answered from the journal: the
    # scheduler is not asked again, so the service stays at 1.
    again = steps.executor.run(up)
    assert again.outcome is Outcome.duplicate and again.ok
    time.sleep(1.0)
    assert apps.read_namespaced_deployment("llm", kube.namespace).spec.replicas == 1

    # A Job has no replicas: the step fails for good, saying why.
    refused = steps.run("resize", f"{kube.namespace}/job/llm", replicas=2)
    assert not refused.ok and not refused.retryable
    assert "only Deployments and StatefulSets" in (refused.error or "")


def pods_by_index(kube: Kube, name: str) -> dict[int, client.V1Pod]:
    return {
        int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p
        for p in running_pods(kube, name)
    }


def gpus_by_node(pods: Iterable[client.V1Pod], gpus: int) -> dict[str, int]:
    placed: dict[str, int] = {}
    for pod in pods:
        placed[pod.spec.node_name] = placed.get(pod.spec.node_name, 0) + gpus
    return placed


def test_an_elastic_indexed_job_shrinks_in_place_and_grows_by_a_restart_once_per_key(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    """Pods of a whole node each, so that where the scheduler puts a restarted Job's pods
    within the nodes it is pinned to is the plan's placement (smaller pods may be stacked
    otherwise: the README's "Elastic training jobs on Kubernetes")."""
    steps = steps_on(KubernetesConnector)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    job_spec = elastic_training_job("train", pods=NODES, gpus=GPUS_PER_NODE, high=NODES)
    # As if an earlier move had left its pointer: the pods run on from it.
    job_spec.spec.template.metadata.annotations[RESUME_FROM] = IMAGE_DIR
    kube.batch.create_namespaced_job(kube.namespace, job_spec)
    wait_for("train's pods to run", lambda: len(pods_by_index(kube, "train")) == NODES)
    before = pods_by_index(kube, "train")
    job = f"{kube.namespace}/job/train"
    report = wait_for(
        "train's report",
        lambda: next(
            (j for j in steps.executor.connector.read_state().jobs if j.external_id == job), None
        ),
    )
    assert (report.gang_size, report.gpus_requested) == (NODES, NODES * GPUS_PER_NODE)
    assert (report.min_replicas, report.max_replicas, report.replicas) == (1, NODES, NODES)

    # Shrink to the two lower indexes where they run: in place, the third pod goes.
    kept = gpus_by_node([before[0], before[1]], GPUS_PER_NODE)
    shrunk = steps.run("resize", job, replicas=2, nodes=sorted(kept), gpus=kept)
    assert shrunk.ok, shrunk.error
    steps.until_ok("confirm", job, expect="running", nodes=sorted(kept), exactly=True, replicas=2)
    wait_for("the third pod to go", lambda: set(pods_by_index(kube, "train")) == {0, 1})
    after = pods_by_index(kube, "train")
    assert [after[i].metadata.uid for i in (0, 1)] == [before[i].metadata.uid for i in (0, 1)]
    spec = kube.batch.read_namespaced_job("train", kube.namespace).spec
    assert (spec.completions, spec.parallelism, spec.suspend) == (2, 2, False)

    # Grow onto all three nodes: a restart there, every pod new.
    nodes = kwok_nodes(kube)
    grow = steps.request("resize", job, replicas=NODES, nodes=nodes)
    grown = steps.executor.run(grow)
    assert grown.ok, grown.error
    steps.until_ok("confirm", job, expect="running", nodes=nodes, exactly=True, replicas=NODES)
    wait_for("every pod to run", lambda: len(pods_by_index(kube, "train")) == NODES)
    restarted = pods_by_index(kube, "train")
    old_uids = {p.metadata.uid for p in before.values()}
    assert not old_uids & {p.metadata.uid for p in restarted.values()}
    # They resume from the job's own checkpoint, not from that older pointer.
    assert resolved_env(before[0], RESUME_FROM_ENV) == IMAGE_DIR
    assert all(resolved_env(p, RESUME_FROM_ENV) is None for p in restarted.values())
    spec = kube.batch.read_namespaced_job("train", kube.namespace).spec
    assert (spec.completions, spec.parallelism) == (NODES, NODES)

    # The same step resent from a connector whose journal is lost finds the Job running
    # where the plan put it; the restart itself, called again under the step's key, finds
    # its stamp on the Job and does not stop it a second time.
    again = steps_on(KubernetesConnector).executor.run(grow)
    assert again.ok, again.error
    actions.restart_indexed_job(
        kube.api, namespace=kube.namespace, job="train", replicas=NODES, nodes=nodes,
        step_key=grow.key,
    )  # fmt: skip
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert current.metadata.annotations["shaper.io/stopped-by-step"] == grow.key
    assert not current.spec.suspend
    assert {p.metadata.uid for p in pods_by_index(kube, "train").values()} == {
        p.metadata.uid for p in restarted.values()
    }

    # A shrink that keeps a pod elsewhere than the lower index runs: restarted there.
    elsewhere = next(n for n in nodes if n != restarted[0].spec.node_name)
    moved = steps.run("resize", job, replicas=1, nodes=[elsewhere], gpus={elsewhere: GPUS_PER_NODE})
    assert moved.ok, moved.error
    confirmed = steps.until_ok(
        "confirm", job, expect="running", nodes=[elsewhere], exactly=True, replicas=1
    )
    assert confirmed.result["nodes"] == [elsewhere]
    wait_for("one pod to run", lambda: len(pods_by_index(kube, "train")) == 1)
    (only,) = pods_by_index(kube, "train").values()
    assert only.spec.node_name == elsewhere and only.metadata.uid != restarted[0].metadata.uid


def test_a_held_elastic_job_starts_at_the_plans_size_and_a_rigid_one_is_not_resized(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KubernetesConnector)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    held = elastic_training_job("held", pods=4, gpus=2, suspend=True)
    kube.batch.create_namespaced_job(kube.namespace, held)
    node = kwok_nodes(kube)[1]
    job = f"{kube.namespace}/job/held"
    started = steps.run("start", job, nodes=[node], replicas=3, gpus={node: 6})
    assert started.ok, started.error
    steps.until_ok("confirm", job, expect="running", nodes=[node], exactly=True, replicas=3)
    wait_for("3 pods to run", lambda: len(pods_by_index(kube, "held")) == 3)
    assert {p.spec.node_name for p in pods_by_index(kube, "held").values()} == {node}
    spec = kube.batch.read_namespaced_job("held", kube.namespace).spec
    assert (spec.completions, spec.parallelism) == (3, 3)

    # A Job that is not an elastic Indexed Job cannot change size: refused, untouched.
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("rigid", gpus=1))
    (pod,) = wait_for("rigid's pod to run", lambda: running_pods(kube, "rigid"))
    refused = steps.run("resize", f"{kube.namespace}/job/rigid", replicas=2, nodes=[node])
    assert not refused.ok and not refused.retryable and "Indexed" in (refused.error or "")
    assert [p.metadata.uid for p in running_pods(kube, "rigid")] == [pod.metadata.uid]


def test_hold_and_release_of_a_kueue_workload_confirmed_through_telemetry(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KueueConnector)
    queue = gpu_queues(kube, gpus=8)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("serve", gpus=4, queue=queue))
    job = f"{kube.namespace}/job/serve"
    (first,) = wait_for("serve's pod to run", lambda: running_pods(kube, "serve"))
    # The allocations carry the node names the control plane knows the nodes by.
    running = steps.until_ok("confirm", job, expect="running", nodes=[first.spec.node_name])
    assert running.result["nodes"] == [first.spec.node_name]

    hold = steps.request("hold", job)
    held = steps.executor.run(hold)
    assert held.ok, held.error
    stopped = steps.until_ok("confirm", job, expect="stopped")
    assert stopped.result["state"] == "pending"
    assert "deactivated" in stopped.result["summary"]
    workload = kube.workload_of_job("serve")
    assert workload is not None and not kueue_actions.is_active(workload)
    wait_for("serve's pods to go", lambda: not kube.pods_of_job("serve"))

    released = steps.run("release", job)
    assert released.ok, released.error
    steps.until_ok("confirm", job, expect="running")
    (again,) = wait_for("serve's pod to run again", lambda: running_pods(kube, "serve"))
    assert again.metadata.uid != first.metadata.uid

    # A resent hold is a duplicate: it does not deactivate the workload a second time.
    assert steps.executor.run(hold).outcome is Outcome.duplicate
    time.sleep(1.0)
    workload = kube.workload_of_job("serve")
    assert workload is not None and kueue_actions.is_active(workload)
    assert admitted(kube, "serve")

    # Unknown or malformed jobs fail for good (the API server's 404), like Slurm's.
    for unknown in (f"{kube.namespace}/job/no-such-job", "not-a-kubernetes-id"):
        missing = steps.run("hold", unknown)
        assert not missing.ok and not missing.retryable, missing.error


def test_requeue_pinned_and_start_move_a_checkpointable_job_with_its_resume_pointer(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KubernetesConnector)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=2))
    (before,) = wait_for("train's pod to run", lambda: running_pods(kube, "train"))
    assert resolved_env(before, RESUME_FROM_ENV) is None
    target = next(n for n in kwok_nodes(kube) if n != before.spec.node_name)
    job = f"{kube.namespace}/job/train"

    # A checkpointed job stopped for another: held, pinned to where its image waits.
    image = {"image_dir": IMAGE_DIR, "backend": "signal"}
    requeued = steps.run("requeue", job, nodes=[target], hold=True, image=image)
    assert requeued.ok, requeued.error
    assert requeued.result["resume_from"] == IMAGE_DIR and requeued.result["held"]
    suspended = kube.batch.read_namespaced_job("train", kube.namespace)
    assert suspended.spec.suspend is True
    assert suspended.spec.template.metadata.annotations[RESUME_FROM] == IMAGE_DIR
    steps.until_ok("confirm", job, expect="stopped")
    assert not running_pods(kube, "train")

    started = steps.run("start", job, nodes=[target])
    assert started.ok, started.error
    confirmed = steps.until_ok("confirm", job, expect="running", nodes=[target])
    assert confirmed.result["nodes"] == [target]
    (after,) = wait_for("train's pod to run", lambda: running_pods(kube, "train"))
    assert after.spec.node_name == target and after.metadata.uid != before.metadata.uid
    assert resolved_env(after, RESUME_FROM_ENV) == IMAGE_DIR

    # Running again, it carries that pointer from the move; a later move without its own
    # checkpoint would restart it from that outdated one: refused, nothing changes.
    stale = steps.run("requeue", job, nodes=[before.spec.node_name])
    assert not stale.ok and not stale.retryable and "start over" in (stale.error or "")
    assert [p.metadata.uid for p in running_pods(kube, "train")] == [after.metadata.uid]


def test_steps_that_would_lose_work_are_refused_and_change_nothing(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KubernetesConnector)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("eval", gpus=1, checkpointable=False))
    (before,) = wait_for("eval's pod to run", lambda: running_pods(kube, "eval"))
    target = next(n for n in kwok_nodes(kube) if n != before.spec.node_name)
    job = f"{kube.namespace}/job/eval"

    moved = steps.run("requeue", job, nodes=[target], resume_from="ckpt://eval/1")
    assert not moved.ok and not moved.retryable
    assert "not checkpointable" in (moved.error or "")
    suspended = steps.run("suspend", job)
    assert not suspended.ok and not suspended.retryable
    assert "start over" in (suspended.error or "")
    assert kube.batch.read_namespaced_job("eval", kube.namespace).spec.suspend is not True
    assert [p.metadata.uid for p in running_pods(kube, "eval")] == [before.metadata.uid]

    # Refusals are final: the resend of the same key is answered from the journal.
    request = steps.request("requeue", job, nodes=[target])
    first = steps.executor.run(request)
    assert not first.ok and steps.executor.run(request).outcome is Outcome.duplicate

    # A bare pod is never moved, checkpoint or not: nothing would recreate it if the
    # connector failed between deleting and creating it.
    kube.core.create_namespaced_pod(kube.namespace, bare_pod("sim", gpus=1))
    sim = wait_for("sim to run", lambda: pod_running(kube, "sim"))
    bare = steps.run("requeue", f"{kube.namespace}/pod/sim", nodes=[target], resume_from="c://1")
    assert not bare.ok and not bare.retryable and "run the workload as a Job" in (bare.error or "")
    assert kube.core.read_namespaced_pod("sim", kube.namespace).metadata.uid == sim.metadata.uid

    # Reservations are not a capability of Kubernetes: the executor refuses the step.
    reserve = steps.run("reserve", job, gpus={target: 1}, ttl_s=60)
    assert reserve.outcome is Outcome.refused and "cannot reserve" in (reserve.error or "")


def test_suspend_of_a_kueue_workload_keeps_the_pointer_and_resume_continues_from_it(
    kube: Kube, steps_on: Callable[[type[KubernetesConnector]], Steps]
) -> None:
    steps = steps_on(KueueConnector)
    queue = gpu_queues(kube, gpus=8)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("pretrain", gpus=8, queue=queue))
    job = f"{kube.namespace}/job/pretrain"
    (before,) = wait_for("pretrain's pod to run", lambda: running_pods(kube, "pretrain"))

    # Without the saga's checkpoint the pods would start over: refused, still running.
    blind = steps.run("suspend", job)
    assert not blind.ok and not blind.retryable and "start over" in (blind.error or "")
    assert [p.metadata.uid for p in running_pods(kube, "pretrain")] == [before.metadata.uid]

    pointer = "ckpt://pretrain/step-1200"
    suspended = steps.run("suspend", job, resume_from=pointer)
    assert suspended.ok, suspended.error
    assert suspended.result["resume_from"] == pointer
    steps.until_ok("confirm", job, expect="stopped")
    assert not kube.pods_of_job("pretrain")
    stored = kube.batch.read_namespaced_job("pretrain", kube.namespace)
    assert stored.metadata.annotations[RESUME_FROM] == pointer

    # The saga's resume: the job is pending (deactivated), so the executor releases it.
    resumed = steps.run("resume", job)
    assert resumed.ok, resumed.error
    steps.until_ok("confirm", job, expect="running")
    (after,) = wait_for("pretrain's new pod to run", lambda: running_pods(kube, "pretrain"))
    assert after.metadata.uid != before.metadata.uid
    assert resolved_env(after, RESUME_FROM_ENV) == pointer


@pytest.mark.parametrize("kind", [KubernetesConnector, KueueConnector], ids=["plain", "kueue"])
def test_a_restart_resent_after_its_answer_was_lost_does_not_restart_the_job_again(
    kind: type[KubernetesConnector],
    kube: Kube,
    tmp_path: Path,
    steps_on: Callable[[type[KubernetesConnector]], Steps],
) -> None:
    """The restart a plan asks for under a policy that allows one (a requeue with neither
    nodes nor a checkpoint) is stamped with the step's key: when the connector dies after
    restarting the job but before journalling its answer, the control plane's resend
    reaches a connector with no memory of it, finds the stamp, and leaves the new pods be."""
    steps = steps_on(kind)
    queue = gpu_queues(kube, gpus=8) if kind is KueueConnector else None
    kube.batch.create_namespaced_job(
        kube.namespace, gpu_job("sweep", gpus=2, checkpointable=False, queue=queue)
    )
    job = f"{kube.namespace}/job/sweep"
    (first,) = wait_for("sweep's pod to run", lambda: running_pods(kube, "sweep"))

    restart = steps.request("requeue", job)
    report = steps.executor.run(restart)
    assert report.ok, report.error
    (second,) = wait_for(
        "sweep's pod to run again",
        lambda: [p for p in running_pods(kube, "sweep") if p.metadata.uid != first.metadata.uid],
    )

    # The same step on a connector whose journal is gone (a new state directory): it runs
    # the step, sees its own stamp on the job, and changes nothing.
    amnesiac = ConnectorStepExecutor(
        steps.executor.connector, cluster=CLUSTER, state_dir=tmp_path / "after-a-crash"
    )
    resent = amnesiac.run(restart)
    assert resent.ok and resent.outcome is Outcome.executed, resent.error
    time.sleep(2.0)
    assert [p.metadata.uid for p in running_pods(kube, "sweep")] == [second.metadata.uid]
    assert kube.batch.read_namespaced_job("sweep", kube.namespace).spec.suspend is not True

    # A new step (its own key) does restart it: the stamp is per step, not per job.
    again = amnesiac.run(steps.request("requeue", job))
    assert again.ok, again.error
    wait_for(
        "sweep's pod to run a third time",
        lambda: [
            p
            for p in running_pods(kube, "sweep")
            if p.metadata.uid not in (first.metadata.uid, second.metadata.uid)
        ],
    )


def test_an_operators_drain_cordons_a_node_and_its_undrain_gives_it_back(
    steps_on: Callable[[type[KubernetesConnector]], Steps], kube: Kube
) -> None:
    """The steps of a drain action (app.actions.drains) on the real API server: the node is
    cordoned, the confirm reads it back draining through the connector's telemetry, a
    resent drain changes nothing, and the undrain's confirm reads it up again."""
    steps = steps_on(KubernetesConnector)
    node = kwok_nodes(kube)[0]
    try:
        drained = steps.run("drain", node, reason="DIMM errors")
        assert drained.ok, drained.error
        assert kube.core.read_node(node).spec.unschedulable is True
        assert steps.until_ok("confirm", node, expect="drained").ok
        assert steps.run("drain", node, reason="DIMM errors").ok  # already drained: a no-op
        assert kube.core.read_node(node).spec.unschedulable is True
        undrained = steps.run("undrain", node)
        assert undrained.ok, undrained.error
        assert not kube.core.read_node(node).spec.unschedulable
        assert steps.until_ok("confirm", node, expect="up").ok
    finally:
        kube.core.patch_node(node, {"spec": {"unschedulable": None}})
