"""The Kubernetes connector's watches against the real control plane (see conftest): a
change reaches a push within seconds, and the watches survive an API server restart (the
new server's watch cache answers the old resource versions with 410 Gone, so the caches
list again), changes made meanwhile included."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from connectors.kubernetes import KubernetesConnector, KubernetesConnectorConfig
from connectors.kubernetes.pods import CHECKPOINTABLE_ANNOTATION, RESUME_FROM_ENV, RESUME_FROM_FIELD
from connectors.runner import RunnerConfig, TelemetryRunner
from tests.k8s.conftest import K8sCluster, Kube, wait_for
from tests.k8s.objects import inference_deployment
from wire.speeds import SPEEDS_KEY
from wire.telemetry import JobShape, JobState, NodeState, TelemetryDelta, TelemetrySnapshot

pytestmark = pytest.mark.slow

GPU = "nvidia.com/gpu"


def gpu_job(name: str, gpus: int = 1, pods: int = 1) -> client.V1Job:
    """A Job outside Kueue (no queue label): the scheduler places it at once."""
    resources = {"cpu": "1", GPU: str(gpus)}
    # Checkpointable as the actions require it: the annotation, and the resume pointer
    # declared from it (connectors.kubernetes.pods.resume_blocker).
    resume_from = client.V1EnvVar(
        name=RESUME_FROM_ENV,
        value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path=RESUME_FROM_FIELD)
        ),
    )
    container = client.V1Container(
        name="work",
        image="registry.example/work:1",
        resources=client.V1ResourceRequirements(requests=resources, limits=resources),
        env=[resume_from],
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"shaper.io/team": "vision"}),
        spec=client.V1JobSpec(
            parallelism=pods,
            completions=pods,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations={CHECKPOINTABLE_ANNOTATION: "true"}),
                spec=client.V1PodSpec(restart_policy="Never", containers=[container]),
            ),
        ),
    )


@pytest.fixture
def connector(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KubernetesConnector]:
    config = KubernetesConnectorConfig(
        cluster="k8s-test", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    with KubernetesConnector(config) as connector:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        yield connector


def job_in(connector: KubernetesConnector, external_id: str) -> Any:
    return next((j for j in connector.read_state().jobs if j.external_id == external_id), None)


def running(connector: KubernetesConnector, external_id: str) -> Any:
    job = job_in(connector, external_id)
    return job if job is not None and job.state is JobState.running else None


def test_a_new_job_reaches_a_push_within_two_seconds(kube: Kube, connector: Any) -> None:
    pushes: list[tuple[float, dict[str, Any]]] = []

    def control_plane(request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        pushes.append((time.monotonic(), payload))
        return httpx.Response(200, json={"cluster": "k8s-test", "seq": payload["seq"]})

    runner = TelemetryRunner(
        connector,
        RunnerConfig(
            control_plane="http://control-plane.test",
            cluster="k8s-test",
            token="t",
            interval_s=60,  # the wake-up, not the interval, must bring the change
        ),
        transport=httpx.MockTransport(control_plane),
    )
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        wait_for("the first snapshot", lambda: pushes)
        assert pushes[0][1]["kind"] == TelemetrySnapshot.model_fields["kind"].default
        created_at = time.monotonic()
        kube.batch.create_namespaced_job(kube.namespace, gpu_job("wake"))
        external_id = f"{kube.namespace}/job/wake"

        def pushed_running() -> float | None:
            for at, payload in pushes:
                for job in payload.get("jobs", []):
                    if job["external_id"] == external_id and job["state"] == "running":
                        return at
            return None

        pushed_at = wait_for("a push with the job running", pushed_running, 30)
        deltas = [p for _, p in pushes[1:]]
        assert all(p["kind"] == TelemetryDelta.model_fields["kind"].default for p in deltas)
        # Job → pod → scheduled → running (kwok) takes the control plane itself a moment;
        # the connector adds the watch and the 0.2 s debounce, never the 60 s interval.
        assert pushed_at - created_at < 5.0, pushed_at - created_at
        job = next(j for j in pushes[-1][1]["jobs"] if j["external_id"] == external_id)
        assert job["team"] == "vision" and job["kind"] == "training"
        assert job["checkpointable"] is True
        assert sum(a["gpu_count"] for a in job["allocations"]) == 1
    finally:
        runner.stop()
        thread.join(timeout=5)
        runner.close()


def test_wait_for_change_fires_on_a_pod_change(kube: Kube, connector: Any) -> None:
    connector.wait_for_change(0)  # what happened before
    started = time.monotonic()
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("nudge"))
    assert connector.wait_for_change(10) is True
    assert time.monotonic() - started < 2.0
    job = wait_for(
        "the job in read_state", lambda: job_in(connector, f"{kube.namespace}/job/nudge")
    )
    assert job.gpus_requested == 1


def test_the_watch_survives_an_api_server_restart(
    k8s_cluster: K8sCluster, kube: Kube, connector: Any
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("before", gpus=2, pods=2))
    before = f"{kube.namespace}/job/before"
    wait_for("the job before the restart to run", lambda: running(connector, before))
    lists_before = connector.informers["pods"].lists

    restarted = k8s_cluster.script("restart", "kube-apiserver")
    assert restarted.returncode == 0, restarted.stderr
    # Changes the connector's watches did not see as they happened: made as soon as the
    # API server is back, while the informers are still reconnecting.
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("after"))
    kube.batch.delete_namespaced_job("before", kube.namespace, propagation_policy="Background")
    node = "kwok-gpu-3"
    kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        after = f"{kube.namespace}/job/after"

        def caught_up() -> bool:
            try:
                state = connector.read_state()
            except Exception:  # not synced yet: the read raises, retryable
                return False
            jobs = {j.external_id: j for j in state.jobs}
            nodes = {n.name: n for n in state.nodes}
            return (
                after in jobs
                and jobs[after].state is JobState.running
                and before not in jobs
                and nodes[node].state is NodeState.draining
            )

        wait_for("the connector to see what changed around the restart", caught_up, 90)
        informers = connector.informers.values()
        # The restart moved etcd's revision past what the watch cache of the new API
        # server keeps: the watches came back through 410 and a fresh list.
        assert connector.informers["pods"].lists > lists_before
        assert sum(i.gone for i in informers) + sum(i.watch_failures for i in informers) > 0
    finally:
        kube.core.patch_node(node, {"spec": {"unschedulable": None}})


def test_a_deployment_is_an_elastic_service(kube: Kube, connector: Any) -> None:
    deployment = inference_deployment("llm", replicas=2, min_replicas=1, max_replicas=6)
    client.AppsV1Api(kube.api).create_namespaced_deployment(kube.namespace, deployment)
    external_id = f"{kube.namespace}/deployment/llm"

    def serving() -> Any:
        job = running(connector, external_id)
        return (
            job
            if job is not None
            and len(job.allocations)
            and sum(a.gpus for a in job.allocations) == 2
            else None
        )

    job = wait_for("the Deployment's two replicas to run", serving)
    assert job.shape is JobShape.elastic and job.kind.value == "realtime_inference"
    assert (job.min_replicas, job.replicas, job.max_replicas) == (1, 2, 6)
    assert job.gpus_requested == 1
    assert connector.owner_object(external_id)["spec"]["replicas"] == 2
    assert len(connector.pods_of(external_id)) == 2


def test_a_jobs_own_speeds_are_pushed_on_the_models_its_cluster_has(
    kube: Kube, connector: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``shaper.io/speeds`` annotation of a Job (wire.speeds) reaches the push; a model
    no node of the cluster has (the nodes are H100s by their product label) is left out
    by the runner, which says so."""
    job = gpu_job("fast")
    job.metadata.annotations = {SPEEDS_KEY: "H100=2.5,B300=4"}
    kube.batch.create_namespaced_job(kube.namespace, job)
    external_id = f"{kube.namespace}/job/fast"
    read = wait_for("the Job's report", lambda: job_in(connector, external_id))
    assert read.speeds == {"H100": 2.5, "B300": 4.0}

    pushes: list[dict[str, Any]] = []

    def control_plane(request: httpx.Request) -> httpx.Response:
        pushes.append(json.loads(request.content))
        return httpx.Response(200, json={"cluster": "k8s-test", "seq": pushes[-1]["seq"]})

    runner = TelemetryRunner(
        connector,
        RunnerConfig(control_plane="http://control-plane.test", cluster="k8s-test", token="t"),
        transport=httpx.MockTransport(control_plane),
    )
    with caplog.at_level(logging.WARNING, logger="connectors.runner"):
        runner.run_once()
    runner.close()
    (pushed,) = [j for j in pushes[0]["jobs"] if j["external_id"] == external_id]
    assert pushed["speeds"] == {"H100": 2.5}
    assert {n["gpu_model"] for n in pushes[0]["nodes"]} == {"H100"}
    assert any(
        f"job {external_id}: leaving out its speeds on B300" in r.getMessage()
        for r in caplog.records
    )
