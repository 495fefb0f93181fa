"""Federated moves on plain Kubernetes against the real control plane of the tests (see
conftest): the spec a Job carries in telemetry, and ``submit``/``withdraw``
(connectors.kubernetes.moves) as the API server, the Job controller and the scheduler carry
them out on kwok nodes.

The two "clusters" of a move are two connectors (``k8s-a``, the source, and ``k8s-b``, the
target) on the one control plane: a moved Job keeps its namespace, so the target's copy
lands next to the source's, under the move's name, and nothing else tells them apart —
which is what the move's mark is for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from app.actions.messages import move_name
from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.kubernetes import KubernetesConnector, KubernetesConnectorConfig
from connectors.kubernetes.pods import HOSTNAME_LABEL, RESUME_FROM, RESUME_FROM_ENV
from connectors.kubernetes.submission import MOVE_MARK, moved_job_name
from tests.k8s.conftest import K8sCluster, Kube, wait_for
from tests.k8s.objects import gpu_job, inference_deployment, resolved_env, running_pods
from wire.steps import StepReport, StepRequest
from wire.telemetry import JobReport, JobState, PortableSpec, SchedulerKind, SubmitSpec

pytestmark = pytest.mark.slow

COMPLETE_AFTER = "pod-complete.stage.kwok.x-k8s.io/delay"


def connector_of(k8s_cluster: K8sCluster, cluster: str, **options: Any) -> KubernetesConnector:
    config = KubernetesConnectorConfig(
        cluster=cluster, kubeconfig=k8s_cluster.kubeconfig, **options
    )
    connector = KubernetesConnector(config)
    assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
    return connector


@pytest.fixture
def source(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KubernetesConnector]:
    with connector_of(k8s_cluster, "k8s-a", namespaces=[kube.namespace]) as connector:
        yield connector


@pytest.fixture
def target(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KubernetesConnector]:
    # "nowhere" is accepted so that a spec naming it reaches the API server's refusal.
    with connector_of(
        k8s_cluster,
        "k8s-b",
        portable_namespace=kube.namespace,
        accept_namespaces=[kube.namespace, "nowhere"],
    ) as connector:
        yield connector


def report(connector: KubernetesConnector, external_id: str) -> JobReport | None:
    return next((j for j in connector.read_state().jobs if j.external_id == external_id), None)


def spec_of(kube: Kube, source: KubernetesConnector, job: str, state: JobState) -> SubmitSpec:
    external_id = f"{kube.namespace}/job/{job}"

    def reported() -> JobReport | None:
        found = report(source, external_id)
        # The spec comes from the Job object; under load the informer can list the Job's
        # pod a cycle before the Job itself, and that one report carries no spec yet.
        return found if found is not None and found.state is state and found.submit else None

    found = wait_for(f"{external_id} reported {state.value} with its submit spec", reported)
    assert found.submit is not None, found
    return found.submit


def waiting_job(name: str, **template_annotations: str) -> client.V1Job:
    """A suspended (pending) GPU Job pinned to kwok-gpu-1 the ways a user or Shaper pins."""
    job = gpu_job(name, gpus=2)
    # No queue label: Kueue, installed on the test cluster, would take the Job over.
    job.metadata.labels = {"shaper.io/team": "vision"}
    job.metadata.annotations = {"example.com/owner": "ada", "shaper.io/stopped-by-step": "k1"}
    job.spec.suspend = True
    template = job.spec.template
    template.metadata.labels = {"app": name}
    template.metadata.annotations = {
        **(template.metadata.annotations or {}),
        RESUME_FROM: "/ckpt/of/cluster-a",
        **template_annotations,
    }
    template.spec.node_selector = {HOSTNAME_LABEL: "kwok-gpu-1", "nvidia.com/gpu.present": "true"}
    return job


def moved_jobs(kube: Kube, move: str) -> list[client.V1Job]:
    listed = kube.batch.list_namespaced_job(
        kube.namespace, label_selector=f"{MOVE_MARK}={moved_job_name(move)}"
    )
    return [j for j in listed.items if j.metadata.deletion_timestamp is None]


def test_a_pending_job_carries_its_spec_cleaned_of_what_only_its_cluster_means(
    kube: Kube, source: KubernetesConnector
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, waiting_job("train"))
    spec = spec_of(kube, source, "train", JobState.pending)

    assert spec.scheduler is SchedulerKind.kubernetes and spec.portable is None
    job = spec.native["job"]
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"}
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    # Identity, labels and the user's annotations travel; the cluster's
    # bookkeeping and Shaper's step stamp do not.
    assert job["metadata"] == {
        "name": "train",
        "namespace": kube.namespace,
        "labels": {"shaper.io/team": "vision"},
        "annotations": {"example.com/owner": "ada"},
    }
    body = job["spec"]
    assert "selector" not in body and "suspend" not in body
    assert (body["parallelism"], body["completions"], body["backoffLimit"]) == (1, 1, 0)
    template = body["template"]
    assert template["metadata"]["labels"] == {"app": "train"}
    assert template["metadata"]["annotations"] == {"shaper.io/checkpointable": "true"}
    pod = template["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "nodeName" not in pod and "affinity" not in pod
    [container] = pod["containers"]
    assert container["image"] == "registry.example/train:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_a_running_job_carries_a_spec_and_a_service_none(
    kube: Kube, source: KubernetesConnector
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("runs", gpus=1))
    kube.apps.create_namespaced_deployment(
        kube.namespace, inference_deployment("serve", replicas=1)
    )
    spec = spec_of(kube, source, "runs", JobState.running)
    # The controller generated a selector and labelled the template with it: neither travels.
    template_labels = spec.native["job"]["spec"]["template"].get("metadata", {}).get("labels", {})
    assert not {"controller-uid", "batch.kubernetes.io/controller-uid", "job-name"} & set(
        template_labels
    )
    assert "selector" not in spec.native["job"]["spec"]
    service = wait_for(
        "the service reported", lambda: report(source, f"{kube.namespace}/deployment/serve")
    )
    assert service.submit is None


def test_submit_creates_the_job_once_and_withdraw_deletes_it(
    kube: Kube, source: KubernetesConnector, target: KubernetesConnector
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, waiting_job("train"))
    spec = spec_of(kube, source, "train", JobState.pending)
    move = f"shaper-41-{kube.namespace}/job/train"

    external_id = target.submit(spec, name=move)
    assert target.submit(spec, name=move) == external_id  # a resent step: found, not created
    [job] = moved_jobs(kube, move)
    assert external_id == f"{kube.namespace}/job/{job.metadata.name}"
    assert job.metadata.name == moved_job_name(move) and len(job.metadata.name) <= 63
    assert job.metadata.annotations[MOVE_MARK] == move
    assert job.metadata.labels["shaper.io/team"] == "vision"
    assert job.spec.suspend is False
    # It runs at the target (the source's copy stays suspended), anywhere: its pin is gone.
    pods = wait_for("the moved job to run", lambda: running_pods(kube, job.metadata.name))
    assert pods[0].metadata.annotations.get(RESUME_FROM) is None
    assert not running_pods(kube, "train")
    assert report(target, external_id) is not None

    assert target.withdraw(move) == external_id
    wait_for("the moved job to be gone", lambda: not moved_jobs(kube, move))
    assert target.withdraw(move) is None  # a second withdraw deletes nothing
    assert kube.batch.read_namespaced_job("train", kube.namespace).spec.suspend is True


def test_a_held_submit_waits_pinned_until_released(
    kube: Kube, source: KubernetesConnector, target: KubernetesConnector, tmp_path: Path
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("counter", gpus=1))
    spec = spec_of(kube, source, "counter", JobState.running)
    move = f"shaper-42-{kube.namespace}/job/counter"

    external_id = target.submit(spec, name=move, nodes=["kwok-gpu-3"], hold=True)
    [job] = moved_jobs(kube, move)
    assert job.spec.suspend is True
    terms = job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms  # noqa: E501
    assert [(e.key, e.operator, e.values) for t in terms for e in t.match_expressions] == [
        (HOSTNAME_LABEL, "In", ["kwok-gpu-3"])
    ]
    wait_for(
        "the held job reported pending",
        lambda: (r := report(target, external_id)) is not None and r.state is JobState.pending,
    )
    assert not kube.pods_of_job(job.metadata.name)
    # A resent held submit answers the same job and changes nothing.
    assert target.submit(spec, name=move, nodes=["kwok-gpu-3"], hold=True) == external_id

    # The saga's release at the target, once the image is staged there: the executor hands
    # over where it is, and the pods read it (SHAPER_RESUME_FROM).
    staged = "/var/lib/shaper/images/counter/generation-1"
    at_b = ConnectorStepExecutor(target, cluster="k8s-b", state_dir=tmp_path)

    def release(key: str) -> None:
        request = StepRequest(
            action_id=42,
            key=key,
            step="release",
            workload_id=external_id,
            args={"resume_from": staged},
        )
        report = at_b.run(request)
        assert report.ok, report.error

    release("42:release")
    pods = wait_for("the released job to run", lambda: running_pods(kube, job.metadata.name))
    assert [p.spec.node_name for p in pods] == ["kwok-gpu-3"]
    assert resolved_env(pods[0], RESUME_FROM_ENV) == staged
    release("42:release:redelivered")  # a new key: the job runs on, as it was
    assert [p.metadata.uid for p in running_pods(kube, job.metadata.name)] == [pods[0].metadata.uid]


def test_withdraw_after_the_moved_job_ran_to_its_end_is_refused_for_good(
    kube: Kube, source: KubernetesConnector, target: KubernetesConnector
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, waiting_job("short", **{COMPLETE_AFTER: "1s"}))
    spec = spec_of(kube, source, "short", JobState.pending)
    move = f"shaper-43-{kube.namespace}/job/short"
    external_id = target.submit(spec, name=move)

    def complete() -> bool:
        [job] = moved_jobs(kube, move)
        return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])

    wait_for("the moved job to complete", complete)
    with pytest.raises(ConnectorError, match="already ran here and ended") as refused:
        target.withdraw(move)
    assert not refused.value.retryable
    assert external_id in str(refused.value)
    assert len(moved_jobs(kube, move)) == 1  # left as it is


def test_specs_this_cluster_cannot_run_are_refused_for_good(
    k8s_cluster: K8sCluster, kube: Kube, source: KubernetesConnector, target: KubernetesConnector
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, waiting_job("train"))
    spec = spec_of(kube, source, "train", JobState.pending)
    cases: list[tuple[SubmitSpec, str, str]] = [
        (
            SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\n"}),
            "shaper-44-a",
            "a slurm job cannot run on kubernetes: its spec has no portable form",
        ),
        (
            SubmitSpec(scheduler=SchedulerKind.ray, portable=PortableSpec(command=["python"])),
            "shaper-44-b",
            "names no container image",
        ),
        (
            SubmitSpec(scheduler=SchedulerKind.kubernetes, native={"script": "x"}),
            "shaper-44-c",
            "native has no Job",
        ),
        (
            spec.model_copy(
                update={
                    "native": {
                        "job": {
                            **spec.native["job"],
                            "metadata": {**spec.native["job"]["metadata"], "namespace": "nowhere"},
                        }
                    }
                }
            ),
            "shaper-44-d",
            "namespace nowhere does not exist in cluster k8s-b",
        ),
        (spec, "no spaces allowed", "move name"),
    ]
    for bad, move, why in cases:
        with pytest.raises(ConnectorError, match=why) as refused:
            target.submit(bad, name=move)
        assert not refused.value.retryable, move
    # A target that reports other namespaces only would never report the job it created.
    with connector_of(
        k8s_cluster, "k8s-c", namespaces=["elsewhere"], accept_namespaces=[kube.namespace]
    ) as narrow:
        with pytest.raises(ConnectorError, match="not among those this connector reports"):
            narrow.submit(spec, name="shaper-44-e")
    # A connector takes moved jobs only into namespaces its operator named: a moved Job
    # runs with what its namespace holds (ServiceAccounts, Secrets).
    with connector_of(k8s_cluster, "k8s-d") as closed:
        with pytest.raises(
            ConnectorError, match=r"does not take moved jobs \(accept_namespaces: none\)"
        ) as shut:
            closed.submit(spec, name="shaper-44-f")
        assert not shut.value.retryable
    assert kube.batch.list_namespaced_job(kube.namespace).items[0].metadata.name == "train"
    assert len(kube.batch.list_namespaced_job(kube.namespace).items) == 1


def test_a_portable_spec_with_an_image_runs_as_a_plain_job(
    kube: Kube, target: KubernetesConnector
) -> None:
    portable = PortableSpec(
        image="registry.example/tool:2",
        command=["python", "-m", "tool"],
        env={"MODE": "fast"},
        gpus=1,
        cpus=2,
        memory_mib=4096,
    )
    move = "shaper-45-hpc-7"
    external_id = target.submit(
        SubmitSpec(scheduler=SchedulerKind.slurm, portable=portable), name=move
    )
    [job] = moved_jobs(kube, move)
    assert external_id == f"{kube.namespace}/job/{job.metadata.name}"
    [container] = job.spec.template.spec.containers
    assert (container.image, container.command) == ("registry.example/tool:2", portable.command)
    assert container.resources.limits == {"nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"}
    assert [(e.name, e.value) for e in container.env] == [("MODE", "fast")]
    wait_for("the portable job to run", lambda: running_pods(kube, job.metadata.name))
    assert target.withdraw(move) == external_id


def test_a_pending_move_through_both_connectors_step_executors(
    kube: Kube, source: KubernetesConnector, target: KubernetesConnector, tmp_path: Path
) -> None:
    """The saga's steps of a pending move as the control plane sends them to each
    cluster's action worker: ``hold@A → submit@B → cancel@A``, and its compensation
    ``withdraw@B → release@A`` for a second move of the same job."""
    at_a = ConnectorStepExecutor(source, cluster="k8s-a", state_dir=tmp_path / "a")
    at_b = ConnectorStepExecutor(target, cluster="k8s-b", state_dir=tmp_path / "b")
    # Pending at A: pinned to a node of A's that this control plane lacks (the pin does not
    # travel, so B's copy runs).
    waiting = gpu_job("train", gpus=1)
    waiting.spec.template.spec.node_selector = {HOSTNAME_LABEL: "node-of-cluster-a"}
    kube.batch.create_namespaced_job(kube.namespace, waiting)
    external_id = f"{kube.namespace}/job/train"
    spec = spec_of(kube, source, "train", JobState.pending)

    def step(executor: ConnectorStepExecutor, kind: str, action: int, **args: Any) -> StepReport:
        request = StepRequest(
            action_id=action,
            key=f"{action}:{kind}",
            step=kind,
            workload_id=external_id,
            args=args,
        )
        report = executor.run(request)
        assert report.ok, report.error
        return report

    # A move that fails after its submit is undone: B's copy goes, A's waits on unheld.
    move = move_name(70, external_id)
    step(at_a, "hold", 70, pending=True)
    submitted = step(
        at_b, "submit", 70, spec=spec.model_dump(mode="json"), name=move, source_cluster="k8s-a"
    )
    moved = submitted.result["external_id"]
    assert moved != external_id and moved.startswith(f"{kube.namespace}/job/shaper-70-")
    assert (
        step(at_b, "withdraw", 70, name=move, source_cluster="k8s-a").result["external_id"] == moved
    )
    # The compensation's release: only of a job still held (a suspended Job is).
    released = step(at_a, "release", 70, if_held=True)
    assert released.result["summary"] == f"released job {external_id}"
    wait_for(
        "A's copy let go again",
        lambda: kube.batch.read_namespaced_job("train", kube.namespace).spec.suspend is False,
    )
    assert not moved_jobs(kube, move)

    # The move that succeeds: B's copy runs, A's is cancelled.
    move = move_name(71, external_id)
    step(at_a, "hold", 71, pending=True)
    submitted = step(
        at_b, "submit", 71, spec=spec.model_dump(mode="json"), name=move, source_cluster="k8s-a"
    )
    step(at_a, "cancel", 71)
    [job] = moved_jobs(kube, move)
    assert submitted.result["external_id"] == f"{kube.namespace}/job/{job.metadata.name}"
    wait_for("B's copy to run", lambda: running_pods(kube, job.metadata.name))
    wait_for(
        "A's copy to be gone",
        lambda: (
            not [
                j
                for j in kube.batch.list_namespaced_job(kube.namespace).items
                if j.metadata.name == "train"
            ]
        ),
    )
    assert step(at_b, "withdraw", 72, name=move_name(72, external_id)).result["external_id"] is None


def test_a_moved_job_is_confirmed_once_its_pods_are_there_and_not_while_none_can_be_made(
    kube: Kube, source: KubernetesConnector, target: KubernetesConnector, tmp_path: Path
) -> None:
    """The confirm a pending job's move runs at its target before it cancels the home copy
    (``expect: accepted``, connectors.kubernetes.arrival): a copy whose pods run is
    accepted; one whose pods the Job controller cannot create (its ServiceAccount does not
    exist here) stays "not yet" — the saga gives up after its polls and undoes the move —
    and one deleted here meanwhile is rejected for good."""
    kube.batch.create_namespaced_job(kube.namespace, waiting_job("train"))
    spec = spec_of(kube, source, "train", JobState.pending)
    at_b = ConnectorStepExecutor(target, cluster="k8s-b", state_dir=tmp_path)
    asked = iter(range(1_000_000))

    def confirm(external_id: str) -> StepReport:
        request = StepRequest(
            action_id=73,
            key=f"73:confirm:{next(asked)}",
            step="confirm",
            workload_id=external_id,
            args={"expect": "accepted"},
        )
        return at_b.run(request)

    def verdict(external_id: str) -> StepReport | None:
        """The confirm's answer once it is not "not yet"."""
        answer = confirm(external_id)
        return answer if answer.ok or not answer.retryable else None

    good_move = move_name(73, f"{kube.namespace}/job/train")
    good = target.submit(spec, name=good_move)
    accepted = wait_for("the moved job's confirm", lambda: verdict(good))
    assert accepted.ok, accepted.error
    # Its pod waiting for the scheduler is queued, as good as running on a node.
    summary = accepted.result["summary"]
    assert summary == f"job {good} is pending: its pods wait for the scheduler" or (
        summary.startswith(f"job {good} runs: its pods are on kwok-")
    ), summary
    wait_for("the moved job to run", lambda: running_pods(kube, good.rsplit("/", 1)[1]))
    running = confirm(good)
    assert running.ok and running.result["summary"].startswith(f"job {good} runs: its pods")

    job = dict(spec.native["job"])
    template = dict(job["spec"]["template"])
    template["spec"] = {**template["spec"], "serviceAccountName": "no-such-account"}
    job["spec"] = {**job["spec"], "template": template}
    stuck_move = move_name(74, f"{kube.namespace}/job/train")
    stuck = target.submit(spec.model_copy(update={"native": {"job": job}}), name=stuck_move)
    for _ in range(8):  # what the Job controller cannot create stays "not yet"
        answer = confirm(stuck)
        assert not answer.ok and answer.retryable, answer
        assert "has no pod yet" in (answer.error or "")
        time.sleep(0.5)
    assert target.withdraw(stuck_move) == stuck  # the move undone: nothing ran
    gone = wait_for("the stuck copy's confirm once it is gone", lambda: verdict(stuck))
    assert not gone.ok and "no longer exists here" in (gone.error or "")
    assert target.withdraw(good_move) == good
