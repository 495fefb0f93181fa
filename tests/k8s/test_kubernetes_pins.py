"""A pin Shaper sets on a Job lasts one run (connectors.kubernetes.pins), on the real control
plane of the tests (see conftest): a Job moved onto a node, whose pod then fails while that
node cannot take it, is reported with its own placement and given it back by the
connector's upkeep, and so is a gang that lost one of its pods; a pin whose run has not
begun, a gang whose pods could not resume, and an operator's edit, stay."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from connectors.base import ConnectorError
from connectors.kubernetes import actions
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pins import LIFTING_PIN, PIN_ANNOTATION, Pin, read_pin
from tests.k8s.conftest import K8sCluster, Kube, wait_for
from tests.k8s.objects import gpu_job
from wire.checkpoint_image import POINTER_PREFIX
from wire.telemetry import JobReport, JobState

pytestmark = pytest.mark.slow

CHECKPOINT = "/shared/ckpt/train/step-100"
# Long enough for a replaced pod (the Job controller's back-off starts at 10 s).
REPLACED_S = 90.0


@pytest.fixture
def connector(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KubernetesConnector]:
    config = KubernetesConnectorConfig(
        cluster="pins", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    made = KubernetesConnector(config)
    assert made.wait_synced(30), [i.error for i in made.informers.values()]
    yield made
    made.close()


@pytest.fixture
def cordon(kube: Kube) -> Iterator[Callable[[str], None]]:
    """``cordon(node)``: the node takes no new pod until the test ends."""
    cordoned: list[str] = []

    def make(node: str) -> None:
        actions.cordon(kube.api, node=node)
        cordoned.append(node)

    yield make
    for node in cordoned:
        try:
            actions.uncordon(kube.api, node=node)
        except actions.ObjectGone:
            pass  # a test deleted it


def retried_job(
    name: str,
    *,
    own_node: str | None = None,
    ignore_disruption: bool = False,
    pods: int = 1,
    elastic: bool = False,
) -> Any:
    """A checkpointable one-pod Job that replaces a failed pod (``backoffLimit`` 3), pinned
    to ``own_node`` by its owner when given; with ``ignore_disruption`` a pod a node's
    failure takes does not count as failed (``podFailurePolicy``). With ``pods`` > 1, a gang
    of that many pods, each holding a whole node's 8 GPUs; ``elastic``: an elastic training
    job (an elastic Indexed Job of 1 to 2 pods, which resumes from its own checkpoint)."""
    job = gpu_job(name, gpus=2 if pods == 1 else 8)
    job.spec.parallelism = job.spec.completions = pods
    job.spec.backoff_limit = 3
    if elastic:
        job.spec.completion_mode = "Indexed"
        job.metadata.annotations = {"shaper.io/min-replicas": "1", "shaper.io/max-replicas": "2"}
    if own_node is not None:
        job.spec.template.spec.affinity = client.V1Affinity(
            node_affinity=client.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                    node_selector_terms=[
                        client.V1NodeSelectorTerm(
                            match_expressions=[
                                client.V1NodeSelectorRequirement(
                                    key="kubernetes.io/hostname", operator="In", values=[own_node]
                                )
                            ]
                        )
                    ]
                )
            )
        )
    if ignore_disruption:
        job.spec.pod_failure_policy = client.V1PodFailurePolicy(
            rules=[
                client.V1PodFailurePolicyRule(
                    action="Ignore",
                    on_pod_conditions=[
                        client.V1PodFailurePolicyOnPodConditionsPattern(
                            type="DisruptionTarget", status="True"
                        )
                    ],
                )
            ]
        )
    return job


def live_pods(kube: Kube, job: str) -> list[client.V1Pod]:
    return [
        p
        for p in kube.pods_of_job(job)
        if not p.metadata.deletion_timestamp and p.status.phase not in ("Succeeded", "Failed")
    ]


def running_on(kube: Kube, job: str) -> str | None:
    pods = [p for p in live_pods(kube, job) if p.status.phase == "Running" and p.spec.node_name]
    return pods[0].spec.node_name if pods else None


def unschedulable(kube: Kube, job: str) -> bool:
    return any(
        c.type == "PodScheduled" and c.reason == "Unschedulable"
        for p in live_pods(kube, job)
        for c in p.status.conditions or []
    )


def report(connector: KubernetesConnector, kube: Kube, job: str) -> JobReport:
    wanted = f"{kube.namespace}/job/{job}"
    return next(j for j in connector.read_state().jobs if j.external_id == wanted)


def fail_its_pod(kube: Kube, job: str, *, disruption: bool = False) -> None:
    """The pod's node fails: the pod is deleted, as the taint eviction would; or, with
    ``disruption``, it ends Failed with the condition the eviction sets (what a kubelet
    reports; kwok plays no failures)."""
    pod = live_pods(kube, job)[0]
    if not disruption:
        kube.core.delete_namespaced_pod(pod.metadata.name, kube.namespace)
        return
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "the node failed",
    }
    kube.core.patch_namespaced_pod_status(
        pod.metadata.name,
        kube.namespace,
        {"status": {"phase": "Failed", "conditions": [condition]}},
    )


def moved_to(kube: Kube, connector: KubernetesConnector, job: str, node: str) -> None:
    """A plan's move of the running Job onto ``node`` (the connector's own step), seen run."""
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job=job, nodes=[node], resume_from=CHECKPOINT
    )
    wait_for(f"{job} to run on {node}", lambda: running_on(kube, job) == node)


def run_and_move_to(kube: Kube, connector: KubernetesConnector, node: str) -> None:
    """Job ``train`` (``retried_job``) runs where the scheduler put it, then a plan moves it
    onto ``node``."""
    kube.batch.create_namespaced_job(kube.namespace, retried_job("train"))
    wait_for("train to run", lambda: running_on(kube, "train") is not None)
    moved_to(kube, connector, "train", node)


def stays_pinned(kube: Kube, connector: KubernetesConnector, node: str) -> None:
    """Three upkeep rounds lift nothing, and ``train`` is reported held to ``node``."""
    for _ in range(3):
        assert connector.upkeep() == []
    wait_for(
        f"train reported held to {node}",
        lambda: report(connector, kube, "train").required_nodes == [node],
    )


def template_affinity(kube: Kube, job: str) -> dict[str, Any] | None:
    read = kube.batch.read_namespaced_job(job, kube.namespace)
    affinity: dict[str, Any] | None = kube.api.sanitize_for_serialization(
        read.spec.template.spec.affinity
    )
    return affinity


def upkeep_until(connector: KubernetesConnector, what: str, done: Callable[[], bool]) -> list[str]:
    """Run the connector's upkeep each second (as its runner does each interval) until
    ``done``; the lines it logged."""
    lines: list[str] = []

    def step() -> bool:
        lines.extend(connector.upkeep())
        return done()

    wait_for(what, step, timeout=REPLACED_S)
    return lines


def test_a_moved_job_whose_pod_failed_runs_elsewhere_once_its_node_cannot_take_it(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    run_and_move_to(kube, connector, "kwok-gpu-2")
    moved = kube.batch.read_namespaced_job("train", kube.namespace)
    # The move's suspension deleted the pod that ran: not counted as failed.
    assert not moved.status.failed
    assert read_pin(moved.metadata.annotations) == Pin(0, ("kwok-gpu-2",), None)

    cordon("kwok-gpu-2")
    fail_its_pod(kube, "train")
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    # The snapshot no longer holds it to the node of the run that is over.
    wait_for(
        "train reported pending with no pin",
        lambda: (
            (r := report(connector, kube, "train")).state is JobState.pending
            and r.required_nodes == []
        ),
    )
    lines = upkeep_until(
        connector, "train to run again", lambda: running_on(kube, "train") is not None
    )
    assert running_on(kube, "train") in ("kwok-gpu-1", "kwok-gpu-3")
    assert any("train" in line and "kwok-gpu-2" in line for line in lines), lines
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert template_affinity(kube, "train") is None
    assert PIN_ANNOTATION not in (current.metadata.annotations or {})
    assert LIFTING_PIN not in (current.metadata.annotations or {})
    assert not current.spec.suspend
    # Its pods resume from the move's checkpoint, as before the failure.
    assert current.spec.template.metadata.annotations["shaper.io/resume-from"] == CHECKPOINT


def test_a_pod_lost_to_a_node_failure_the_job_ignores_still_ends_the_pin(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """With a podFailurePolicy that ignores disruptions, the node's failure does not raise
    the Job's failed count: the upkeep's mark that the pinned run began does."""
    kube.batch.create_namespaced_job(kube.namespace, retried_job("train", ignore_disruption=True))
    try:
        ignored_failure_ends_the_pin(kube, connector, cordon)
    finally:
        delete_as_a_kubelet_would(kube, "train")


def delete_as_a_kubelet_would(kube: Kube, job: str) -> None:
    """Delete a Job whose pods a ``podFailurePolicy`` keeps until they end: the Job
    controller holds a deleted pod (its tracking finalizer) until the pod is terminal, and
    kwok never ends one — here the test ends them, as a kubelet does."""
    kube.batch.delete_namespaced_job(job, kube.namespace, propagation_policy="Background")

    def ended() -> bool:
        pods = kube.pods_of_job(job)
        for pod in pods:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            try:
                kube.core.patch_namespaced_pod_status(
                    pod.metadata.name, kube.namespace, {"status": {"phase": "Failed"}}
                )
            except ApiException as error:
                if error.status != 404:  # gone meanwhile
                    raise
        return not pods

    wait_for(f"the pods of {job} gone", ended)


def ignored_failure_ends_the_pin(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    wait_for("train to run", lambda: running_on(kube, "train") is not None)
    moved_to(kube, connector, "train", "kwok-gpu-2")
    upkeep_until(
        connector,
        "the pin marked started",
        lambda: bool(
            (
                pin := read_pin(
                    kube.batch.read_namespaced_job("train", kube.namespace).metadata.annotations
                )
            )
            and pin.started
        ),
    )
    cordon("kwok-gpu-2")
    fail_its_pod(kube, "train", disruption=True)
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    assert not kube.batch.read_namespaced_job("train", kube.namespace).status.failed
    upkeep_until(connector, "train to run again", lambda: running_on(kube, "train") is not None)
    assert running_on(kube, "train") in ("kwok-gpu-1", "kwok-gpu-3")


def test_the_jobs_own_pin_comes_back_exactly(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, retried_job("train", own_node="kwok-gpu-1"))
    wait_for("train to run on its own node", lambda: running_on(kube, "train") == "kwok-gpu-1")
    own = template_affinity(kube, "train")
    moved_to(kube, connector, "train", "kwok-gpu-2")
    # A second move replaces Shaper's pin; the stamp still records the Job's own.
    moved_to(kube, connector, "train", "kwok-gpu-3")
    stamp = read_pin(kube.batch.read_namespaced_job("train", kube.namespace).metadata.annotations)
    assert stamp is not None and stamp.nodes == ("kwok-gpu-3",) and stamp.affinity == own

    cordon("kwok-gpu-3")
    fail_its_pod(kube, "train")
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    wait_for(
        "train reported held to its own node",
        lambda: report(connector, kube, "train").required_nodes == ["kwok-gpu-1"],
    )
    upkeep_until(
        connector, "train back on its own node", lambda: running_on(kube, "train") is not None
    )
    assert running_on(kube, "train") == "kwok-gpu-1"
    assert template_affinity(kube, "train") == own


def test_a_pin_whose_run_has_not_begun_stays(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """A plan's start onto a node that is not free yet (its plan is freeing it): the pod
    waits there, and the pin is the plan's, not stale."""
    held = retried_job("train")
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    cordon("kwok-gpu-2")
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job="train", nodes=["kwok-gpu-2"], resume_from=None
    )
    wait_for("train's pod to wait", lambda: unschedulable(kube, "train"))
    stays_pinned(kube, connector, "kwok-gpu-2")
    stamp = read_pin(kube.batch.read_namespaced_job("train", kube.namespace).metadata.annotations)
    assert stamp is not None and not stamp.started


def test_an_operators_edit_of_the_pinned_template_is_kept(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """Once someone else changed the template's pin, it is theirs: not lifted, and reported
    as it is."""
    run_and_move_to(kube, connector, "kwok-gpu-2")
    cordon("kwok-gpu-2")
    cordon("kwok-gpu-3")
    actions.suspend_job(kube.api, namespace=kube.namespace, job="train")
    wait_for("train to stop", lambda: not live_pods(kube, "train"))
    edited = json.loads(json.dumps(template_affinity(kube, "train")))
    terms = edited["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["kwok-gpu-3"]
    kube.batch.patch_namespaced_job(
        "train", kube.namespace, {"spec": {"template": {"spec": {"affinity": edited}}}}
    )
    actions.resume_job(kube.api, namespace=kube.namespace, job="train")
    wait_for("train's pod to wait on kwok-gpu-3", lambda: unschedulable(kube, "train"))
    kube.core.delete_namespaced_pod(live_pods(kube, "train")[0].metadata.name, kube.namespace)
    wait_for(
        "the failure counted",
        lambda: kube.batch.read_namespaced_job("train", kube.namespace).status.failed,
    )
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    stays_pinned(kube, connector, "kwok-gpu-3")
    assert template_affinity(kube, "train") == edited


def test_a_start_onto_the_nodes_a_spent_pin_names_is_a_new_pin(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """A Job whose pinned run began is held (a plan's preemption), then started by a plan on
    the same node, not free yet: that start's pin is for the next run, and stays."""
    run_and_move_to(kube, connector, "kwok-gpu-2")
    upkeep_until(connector, "the pin marked started", lambda: pin_of(kube, "train").started)
    actions.suspend_job_to_resume(
        kube.api, namespace=kube.namespace, job="train", resume_from=CHECKPOINT + "-2"
    )
    cordon("kwok-gpu-2")
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job="train", nodes=["kwok-gpu-2"], resume_from=None
    )
    assert not pin_of(kube, "train").started
    wait_for("train's pod to wait", lambda: unschedulable(kube, "train"))
    stays_pinned(kube, connector, "kwok-gpu-2")


def test_a_hold_made_while_a_lift_was_left_halfway_is_kept(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """The connector stopped in the middle of a lift (the Job suspended and marked), and a
    plan's hold came before the next round: the hold is the step's, the mark goes, and the
    next round does not let the Job run."""
    run_and_move_to(kube, connector, "kwok-gpu-2")
    cordon("kwok-gpu-2")
    fail_its_pod(kube, "train")
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    # What the lift's first patch does, its connector then gone.
    halfway = {"metadata": {"annotations": {LIFTING_PIN: "true"}}, "spec": {"suspend": True}}
    kube.batch.patch_namespaced_job("train", kube.namespace, halfway)
    connector.hold(f"{kube.namespace}/job/train")
    for _ in range(3):
        connector.upkeep()
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert current.spec.suspend
    assert LIFTING_PIN not in (current.metadata.annotations or {})
    assert not live_pods(kube, "train")


def pin_of(kube: Kube, job: str) -> Pin:
    pin = read_pin(kube.batch.read_namespaced_job(job, kube.namespace).metadata.annotations)
    assert pin is not None, f"{job} carries no pin stamp"
    return pin


def nodes_running(kube: Kube, job: str) -> list[str]:
    return sorted(
        p.spec.node_name
        for p in live_pods(kube, job)
        if p.status.phase == "Running" and p.spec.node_name
    )


def pin_gang_to_2_and_3(kube: Kube, resume_from: str | None) -> None:
    """A plan's start or move of ``gang`` onto kwok-gpu-2 and kwok-gpu-3."""
    actions.recreate_job_pinned(
        kube.api,
        namespace=kube.namespace,
        job="gang",
        nodes=["kwok-gpu-2", "kwok-gpu-3"],
        resume_from=resume_from,
    )


def gang_pinned_to_2_and_3(
    kube: Kube, connector: KubernetesConnector, *, elastic: bool = True
) -> None:
    """Gang ``gang`` (two pods of 8 GPUs; ``retried_job``) started by a plan onto kwok-gpu-2
    and kwok-gpu-3, seen run there (its pin marked started)."""
    held = retried_job("gang", pods=2, elastic=elastic)
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    pin_gang_to_2_and_3(kube, CHECKPOINT)
    wait_for(
        "gang to run on kwok-gpu-2 and kwok-gpu-3",
        lambda: nodes_running(kube, "gang") == ["kwok-gpu-2", "kwok-gpu-3"],
    )
    upkeep_until(connector, "the pin marked started", lambda: pin_of(kube, "gang").started)


def lose_its_pod_on_3(kube: Kube, cordon: Callable[[str], None]) -> None:
    """kwok-gpu-3 fails: the gang's pod there is deleted and its replacement finds no node
    (kwok-gpu-2 is full with the gang's other pod)."""
    cordon("kwok-gpu-3")
    lost = next(p for p in live_pods(kube, "gang") if p.spec.node_name == "kwok-gpu-3")
    kube.core.delete_namespaced_pod(lost.metadata.name, kube.namespace)
    wait_for("the gang's next pod to wait", lambda: unschedulable(kube, "gang"), REPLACED_S)


def test_an_elastic_gang_that_lost_a_pod_on_its_pinned_nodes_runs_elsewhere(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    gang_pinned_to_2_and_3(kube, connector)
    lose_its_pod_on_3(kube, cordon)
    # Not stopped before its replacement has waited GANG_STRANDED_S (60 s).
    assert connector.upkeep() == []
    assert nodes_running(kube, "gang") == ["kwok-gpu-2"]
    connector.gang_stranded_s = 2.0
    lines = upkeep_until(
        connector,
        "gang to run on kwok-gpu-1 and kwok-gpu-2",
        lambda: nodes_running(kube, "gang") == ["kwok-gpu-1", "kwok-gpu-2"],
    )
    assert any("gang" in line and "stopped 1 running pod(s)" in line for line in lines), lines
    current = kube.batch.read_namespaced_job("gang", kube.namespace)
    assert template_affinity(kube, "gang") is None
    assert PIN_ANNOTATION not in (current.metadata.annotations or {})
    assert LIFTING_PIN not in (current.metadata.annotations or {})
    # The move's checkpoint is older than the work done since: its own checkpoint it is.
    assert "shaper.io/resume-from" not in (current.spec.template.metadata.annotations or {})


def test_a_gang_whose_pod_waits_for_a_pinned_node_being_freed_stays_pinned(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """A plan's start of a gang onto two nodes, one not free yet: one pod runs, the other
    waits; the run lost no pod, so its pin stays however long that takes."""
    held = retried_job("gang", pods=2, elastic=True)
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    cordon("kwok-gpu-3")
    pin_gang_to_2_and_3(kube, CHECKPOINT)
    wait_for("one pod to run", lambda: nodes_running(kube, "gang") == ["kwok-gpu-2"])
    wait_for("the other to wait", lambda: unschedulable(kube, "gang"))
    connector.gang_stranded_s = 0.0
    upkeep_until(connector, "the pin marked started", lambda: pin_of(kube, "gang").started)
    for _ in range(3):
        assert connector.upkeep() == []
    assert not kube.batch.read_namespaced_job("gang", kube.namespace).spec.suspend
    assert pin_of(kube, "gang").nodes == ("kwok-gpu-2", "kwok-gpu-3")
    assert nodes_running(kube, "gang") == ["kwok-gpu-2"]


def test_a_stranded_gang_whose_stop_would_lose_work_is_left_and_said_once(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """A rigid gang's pods resume from the pointer the move left, older than their work:
    it stays pinned, and the upkeep says so once."""
    gang_pinned_to_2_and_3(kube, connector, elastic=False)
    running = next(
        p.metadata.name for p in live_pods(kube, "gang") if p.spec.node_name == "kwok-gpu-2"
    )
    lose_its_pod_on_3(kube, cordon)
    connector.gang_stranded_s = 0.0
    said: list[str] = []

    def told() -> bool:
        said.extend(connector.upkeep())
        return bool(said)

    wait_for("a line about the gang", told)
    assert len(said) == 1 and "left pinned" in said[0], said
    assert "only an elastic training job resumes from its own" in said[0], said
    for _ in range(3):
        assert connector.upkeep() == []
    assert [p.metadata.name for p in live_pods(kube, "gang") if p.spec.node_name] == [running]
    assert not kube.batch.read_namespaced_job("gang", kube.namespace).spec.suspend


def test_a_moved_gang_that_lost_a_pod_its_failure_policy_ignores_runs_elsewhere(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """The lost pod is not counted failed (``podFailurePolicy``): its Failed pod, made
    since the move let the Job run again, says the run lost it."""
    job = retried_job("gang", pods=2, elastic=True, ignore_disruption=True)
    kube.batch.create_namespaced_job(kube.namespace, job)
    try:
        wait_for("gang to run", lambda: len(nodes_running(kube, "gang")) == 2)
        began = kube.batch.read_namespaced_job("gang", kube.namespace).status.start_time
        time.sleep(1.5)  # the API server's times are whole seconds
        pin_gang_to_2_and_3(kube, CHECKPOINT)
        wait_for(
            "gang to run on kwok-gpu-2 and kwok-gpu-3",
            lambda: nodes_running(kube, "gang") == ["kwok-gpu-2", "kwok-gpu-3"],
        )
        # What the rule rests on: resuming the Job restarted its clock.
        assert kube.batch.read_namespaced_job("gang", kube.namespace).status.start_time > began
        cordon("kwok-gpu-3")
        lost = next(p for p in live_pods(kube, "gang") if p.spec.node_name == "kwok-gpu-3")
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
        }
        kube.core.patch_namespaced_pod_status(
            lost.metadata.name,
            kube.namespace,
            {"status": {"phase": "Failed", "conditions": [condition]}},
        )
        wait_for("the gang's next pod to wait", lambda: unschedulable(kube, "gang"), REPLACED_S)
        assert not kube.batch.read_namespaced_job("gang", kube.namespace).status.failed
        connector.gang_stranded_s = 2.0
        upkeep_until(
            connector,
            "gang to run on kwok-gpu-1 and kwok-gpu-2",
            lambda: nodes_running(kube, "gang") == ["kwok-gpu-1", "kwok-gpu-2"],
        )
        assert template_affinity(kube, "gang") is None
    finally:
        delete_as_a_kubelet_would(kube, "gang")


def test_a_pin_to_checkpoint_images_whose_node_left_the_cluster_is_lifted(
    kube: Kube,
    connector: KubernetesConnector,
    cordon: Callable[[str], None],
    node_that_goes: str,
) -> None:
    """Preempted with a kubelet checkpoint, a Job resumes from images on one node and is
    pinned there. While that node is only down (cordoned) its images may come back: the
    pin stays. Once the node is deleted, the images went with it: the pin, the pointer and
    the restore label come off, and the Job runs elsewhere."""
    images = POINTER_PREFIX + json.dumps({"node": node_that_goes, "images": {"trainer": "ckpt:1"}})
    held = retried_job("train")
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job="train", nodes=[node_that_goes], resume_from=images
    )
    wait_for(
        f"train to run on {node_that_goes}", lambda: running_on(kube, "train") == node_that_goes
    )
    upkeep_until(connector, "the pin marked started", lambda: pin_of(kube, "train").started)

    cordon(node_that_goes)
    fail_its_pod(kube, "train")
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    for _ in range(3):
        assert connector.upkeep() == []
    assert pin_of(kube, "train").nodes == (node_that_goes,)

    kube.core.delete_node(node_that_goes)
    lines = upkeep_until(
        connector, "train to run again", lambda: running_on(kube, "train") is not None
    )
    assert running_on(kube, "train") in ("kwok-gpu-1", "kwok-gpu-2", "kwok-gpu-3")
    assert any(f"went with node {node_that_goes}" in line for line in lines), lines
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert PIN_ANNOTATION not in (current.metadata.annotations or {})
    assert template_affinity(kube, "train") is None
    meta = current.spec.template.metadata
    assert "shaper.io/resume-from" not in (meta.annotations or {})
    assert "shaper.io/restore" not in (meta.labels or {})


def test_a_pointer_to_images_lost_with_their_node_comes_off_a_job_shaper_did_not_pin(
    kube: Kube, connector: KubernetesConnector, node_that_goes: str
) -> None:
    """A Job suspended to resume from checkpoint images and let run (no pin of Shaper's:
    the restore webhook holds such pods to the images' node by the template's label). Here
    the Job's own node selector holds it there, as the webhook would: once the node is
    deleted, the pointer and the label come off, and the Job's own placement stays."""
    images = POINTER_PREFIX + json.dumps({"node": node_that_goes, "images": {"trainer": "ckpt:1"}})
    held = retried_job("train")
    held.spec.suspend = True
    held.spec.template.spec.node_selector = {"kubernetes.io/hostname": node_that_goes}
    kube.batch.create_namespaced_job(kube.namespace, held)
    actions.suspend_job_to_resume(
        kube.api, namespace=kube.namespace, job="train", resume_from=images
    )
    actions.resume_job(kube.api, namespace=kube.namespace, job="train")
    wait_for(
        f"train to run on {node_that_goes}", lambda: running_on(kube, "train") == node_that_goes
    )
    kube.core.delete_node(node_that_goes)
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)

    def pointer_gone() -> bool:
        meta = kube.batch.read_namespaced_job("train", kube.namespace).spec.template.metadata
        return "shaper.io/resume-from" not in (meta.annotations or {})

    lines = upkeep_until(connector, "the pointer to come off", pointer_gone)
    assert any(f"went with node {node_that_goes}" in line for line in lines), lines
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert "shaper.io/restore" not in (current.spec.template.metadata.labels or {})
    assert current.spec.template.spec.node_selector == {"kubernetes.io/hostname": node_that_goes}
    assert not current.spec.suspend
    assert LIFTING_PIN not in (current.metadata.annotations or {})


@pytest.mark.parametrize("pinned", [False, True], ids=["by-the-webhook", "by-shapers-pin"])
def test_a_held_job_loses_its_pointer_to_images_gone_with_their_node_and_stays_held(
    kube: Kube, connector: KubernetesConnector, node_that_goes: str, pinned: bool
) -> None:
    """A Job preempted with a kubelet checkpoint and held (suspended to resume from images on
    one node; by a hold step, also pinned there) has no pod: the telemetry reports it held
    to the images' node, so that no plan starts it elsewhere. Once that node is deleted, the
    pointer and the restore label come off (and the pin to it), the Job stays held, and a
    plan may start it anywhere."""
    images = POINTER_PREFIX + json.dumps({"node": node_that_goes, "images": {"trainer": "ckpt:1"}})
    held = retried_job("train")
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    actions.suspend_job_to_resume(
        kube.api,
        namespace=kube.namespace,
        job="train",
        resume_from=images,
        nodes=[node_that_goes] if pinned else None,
    )
    wait_for(
        f"train reported held to {node_that_goes}",
        lambda: report(connector, kube, "train").required_nodes == [node_that_goes],
    )
    for _ in range(3):
        assert connector.upkeep() == []
    # A start elsewhere would leave its pods waiting for the images' node: refused, untouched.
    external_id = f"{kube.namespace}/job/train"
    with pytest.raises(ConnectorError, match=f"checkpoint images are on node {node_that_goes}"):
        connector.start(external_id, nodes=["kwok-gpu-1"])
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert current.spec.suspend
    assert current.spec.template.metadata.annotations["shaper.io/resume-from"] == images

    kube.core.delete_node(node_that_goes)

    def pointer_gone() -> bool:
        meta = kube.batch.read_namespaced_job("train", kube.namespace).spec.template.metadata
        return "shaper.io/resume-from" not in (meta.annotations or {})

    lines = upkeep_until(connector, "the pointer to come off", pointer_gone)
    assert any(f"went with node {node_that_goes}" in line for line in lines), lines
    assert all("stays held" in line for line in lines), lines
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert current.spec.suspend
    assert "shaper.io/restore" not in (current.spec.template.metadata.labels or {})
    assert PIN_ANNOTATION not in (current.metadata.annotations or {})
    assert LIFTING_PIN not in (current.metadata.annotations or {})
    assert template_affinity(kube, "train") is None
    wait_for(
        "train reported held nowhere",
        lambda: report(connector, kube, "train").required_nodes == [],
    )
    assert connector.upkeep() == []
    connector.start(external_id, nodes=["kwok-gpu-1"])  # a plan's start, now anywhere
    wait_for("train to run on kwok-gpu-1", lambda: running_on(kube, "train") == "kwok-gpu-1")


def test_images_on_a_node_the_cache_misses_but_the_api_server_has_stay(
    kube: Kube, connector: KubernetesConnector, cordon: Callable[[str], None]
) -> None:
    """A node list that lags (a stalled watch) never lets a Job's only checkpoint go: the
    API server must say the node is gone."""
    images = POINTER_PREFIX + json.dumps({"node": "kwok-gpu-2", "images": {"trainer": "ckpt:1"}})
    held = retried_job("train")
    held.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, held)
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job="train", nodes=["kwok-gpu-2"], resume_from=images
    )
    wait_for("train to run on kwok-gpu-2", lambda: running_on(kube, "train") == "kwok-gpu-2")
    cordon("kwok-gpu-2")
    fail_its_pod(kube, "train")
    wait_for("train's next pod to wait", lambda: unschedulable(kube, "train"), REPLACED_S)
    lagging = {"kwok-gpu-1", "kwok-gpu-3"}  # kwok-gpu-2 missing
    lifted = actions.lift_stale_pin(
        kube.api, namespace=kube.namespace, job="train", known_nodes=lagging
    )
    assert lifted is None
    current = kube.batch.read_namespaced_job("train", kube.namespace)
    assert not current.spec.suspend
    assert current.spec.template.metadata.annotations["shaper.io/resume-from"] == images
    assert pin_of(kube, "train").nodes == ("kwok-gpu-2",)
