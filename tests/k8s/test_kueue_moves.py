"""Federated moves between Kueue clusters against the real Kueue v0.17 manager and control
plane of the tests (see conftest): the spec a job waiting for admission carries, and
``submit``/``withdraw`` of the Kueue connector (connectors.kueue.capabilities over
connectors.kubernetes.moves).

The two "clusters" are two Kueue connectors (``kueue-a``, the source, and ``kueue-b``, the
target) on the one control plane, sharing its LocalQueue: a moved Job keeps its namespace
and its queue, so the target's copy queues next to the source's, under the move's name.
As the saga does, the source's job is held (its Workload deactivated) before it moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.kubernetes import KubernetesConnectorConfig
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER, QUEUE_LABEL
from connectors.kubernetes.submission import MOVE_MARK, moved_job_name
from connectors.kueue import KueueConnector
from connectors.kueue import actions as kueue_actions
from tests.k8s.conftest import K8sCluster, Kube, wait_for
from tests.k8s.objects import admitted, gpu_job, gpu_queues, running_pods
from tests.k8s.test_kueue_actions import stays
from wire.steps import StepReport, StepRequest
from wire.telemetry import JobReport, JobState, PortableSpec, SchedulerKind, SubmitSpec

pytestmark = pytest.mark.slow


def kueue_connector(k8s_cluster: K8sCluster, kube: Kube, cluster: str) -> KueueConnector:
    config = KubernetesConnectorConfig(
        cluster=cluster,
        kubeconfig=k8s_cluster.kubeconfig,
        namespaces=[kube.namespace],
        accept_namespaces=[kube.namespace],
    )
    connector = KueueConnector(config)
    assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
    return connector


@pytest.fixture
def source(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KueueConnector]:
    with kueue_connector(k8s_cluster, kube, "kueue-a") as connector:
        yield connector


@pytest.fixture
def target(k8s_cluster: K8sCluster, kube: Kube) -> Iterator[KueueConnector]:
    with kueue_connector(k8s_cluster, kube, "kueue-b") as connector:
        yield connector


def report(connector: KueueConnector, external_id: str) -> JobReport | None:
    return next((j for j in connector.read_state().jobs if j.external_id == external_id), None)


def held_spec(kube: Kube, source: KueueConnector, job: str) -> SubmitSpec:
    """The spec of ``job`` once it runs and the source held it (the saga's ``hold@A``):
    none while it is admitted, one once it waits again."""
    external_id = f"{kube.namespace}/job/{job}"
    running = wait_for(
        f"{job} reported running",
        lambda: (
            (r := report(source, external_id)) is not None and r.state is JobState.running and r
        ),
    )
    assert running.submit is None  # admitted: its template carries its flavor's selectors
    source.hold(external_id)
    waiting = wait_for(
        f"{job} reported held",
        lambda: (
            (r := report(source, external_id)) is not None
            and r.state is JobState.pending
            and r.submit is not None
            and r
        ),
    )
    assert waiting.submit is not None
    return waiting.submit


def moved_job(kube: Kube, move: str) -> str | None:
    listed = kube.batch.list_namespaced_job(
        kube.namespace, label_selector=f"{MOVE_MARK}={moved_job_name(move)}"
    )
    names = [j.metadata.name for j in listed.items if j.metadata.deletion_timestamp is None]
    assert len(names) <= 1, names
    return names[0] if names else None


def test_a_held_kueue_job_moves_and_runs_at_the_target_once(
    kube: Kube, source: KueueConnector, target: KueueConnector, tmp_path: Path
) -> None:
    queue = gpu_queues(kube, gpus=4)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=2, queue=queue))
    spec = held_spec(kube, source, "train")
    assert spec.scheduler is SchedulerKind.kueue
    job = spec.native["job"]
    assert job["metadata"]["labels"] == {QUEUE_LABEL: queue}
    assert "suspend" not in job["spec"] and "selector" not in job["spec"]
    template = job["spec"]["template"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in template["metadata"].get("labels", {}))
    assert "nodeSelector" not in template["spec"]  # Kueue's flavor selector was taken back

    move = f"shaper-51-{kube.namespace}/job/train"
    external_id = target.submit(spec, name=move)
    assert target.submit(spec, name=move) == external_id  # resent: the same job, one of it
    name = moved_job(kube, move)
    assert name is not None and external_id == f"{kube.namespace}/job/{name}"
    # Kueue admits it (the source's copy holds no quota) and its pod runs.
    wait_for("the moved job to be admitted", lambda: admitted(kube, name))
    wait_for("the moved job to run", lambda: running_pods(kube, name))
    assert not running_pods(kube, "train")

    assert target.withdraw(move) == external_id
    wait_for("the moved job to be gone", lambda: moved_job(kube, move) is None)
    wait_for("its Workload to be gone", lambda: kube.workload_of_job(name) is None)
    assert target.withdraw(move) is None

    # The compensation's release at the source, as the saga sends it (only of a job still
    # held: a deactivated Workload is), through the source's action executor.
    at_a = ConnectorStepExecutor(source, cluster="kueue-a", state_dir=tmp_path)
    home = f"{kube.namespace}/job/train"
    request = StepRequest(
        action_id=51, key="51:release", step="release", workload_id=home, args={"if_held": True}
    )
    released = at_a.run(request)
    assert released.ok and released.result["summary"] == f"released job {home}", released
    wait_for("the source's copy to run again", lambda: running_pods(kube, "train"))


def test_a_held_submit_deactivates_the_workload_until_released(
    kube: Kube, source: KueueConnector, target: KueueConnector
) -> None:
    queue = gpu_queues(kube, gpus=4)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=1, queue=queue))
    spec = held_spec(kube, source, "train")
    move = f"shaper-52-{kube.namespace}/job/train"

    external_id = target.submit(spec, name=move, hold=True)
    name = moved_job(kube, move)
    assert name is not None
    workload = kube.workload_of_job(name)
    assert workload is not None and not kueue_actions.is_active(workload)
    # Kueue may have admitted it before the deactivation landed (the window the Kueue
    # connector's after_submit names); the deactivation evicts it again.
    wait_for("the held job out of admission", lambda: admitted(kube, name) is None)
    wait_for("the held job's pods to be gone", lambda: not running_pods(kube, name))
    stays("the held job out of admission", lambda: admitted(kube, name) is None)
    # A resent held submit finds its stamp and does not hold again.
    assert target.submit(spec, name=move, hold=True) == external_id
    # Held by Shaper (its mark): the confirm of a pending job's move accepts it.
    assert "deactivated by Shaper: held in the queue" in target.check_arrival(external_id)

    target.release(external_id)
    wait_for("the released job to run", lambda: running_pods(kube, name))
    released = kube.workload_of_job(name) or {}
    assert DEACTIVATED_BY_SHAPER not in (released["metadata"].get("annotations") or {})
    assert target.submit(spec, name=move, hold=True) == external_id
    stays("the released job running", lambda: running_pods(kube, name), seconds=2.0)

    # Deactivated without Shaper's mark (as Kueue deactivates one whose AdmissionCheck
    # rejected it): no release of Shaper's lets it run, so the confirm rejects it.
    kube.custom.patch_namespaced_custom_object(
        kueue_actions.GROUP,
        kueue_actions.VERSION,
        kube.namespace,
        kueue_actions.WORKLOADS,
        released["metadata"]["name"],
        {"spec": {"active": False}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(ConnectorError, match="was deactivated, not by Shaper") as rejected:
        target.check_arrival(external_id)
    assert not rejected.value.retryable


def test_what_kueue_cannot_take_is_refused_before_anything_is_created(
    kube: Kube, source: KueueConnector, target: KueueConnector
) -> None:
    queue = gpu_queues(kube, gpus=4)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=1, queue=queue))
    spec = held_spec(kube, source, "train")
    cases = [
        (spec, {"nodes": ["kwok-gpu-1"], "hold": True}, "cannot be pinned to kwok-gpu-1"),
        (
            spec.model_copy(update={"scheduler": SchedulerKind.kubernetes}),
            {},
            "a kubernetes job cannot run on kueue: its spec has no portable form",
        ),
        (
            SubmitSpec(
                scheduler=SchedulerKind.slurm,
                portable=PortableSpec(image="registry.example/tool:1", gpus=1),
            ),
            {},
            "set portable_queue",
        ),
    ]
    for index, (bad, options, why) in enumerate(cases):
        move = f"shaper-53-{index}"
        with pytest.raises(ConnectorError, match=why) as refused:
            target.submit(bad, name=move, **options)  # type: ignore[arg-type]
        assert not refused.value.retryable
        assert moved_job(kube, move) is None


def test_a_moved_job_is_confirmed_once_kueue_takes_it_and_rejected_if_it_cannot_admit_it(
    kube: Kube, source: KueueConnector, target: KueueConnector, tmp_path: Path
) -> None:
    """The confirm a pending job's move runs at its target before it cancels the home copy
    (``expect: accepted``, connectors.kubernetes.arrival): a copy Kueue queues or admits is
    accepted; one whose LocalQueue does not exist here is inadmissible, rejected for good —
    and the move's withdraw then deletes it (it never ran)."""
    queue = gpu_queues(kube, gpus=4)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=2, queue=queue))
    spec = held_spec(kube, source, "train")
    at_b = ConnectorStepExecutor(target, cluster="kueue-b", state_dir=tmp_path)
    asked = iter(range(1_000_000))

    def verdict(external_id: str) -> StepReport | None:
        """The confirm's answer once it is not "not yet"."""
        request = StepRequest(
            action_id=54,
            key=f"54:confirm:{next(asked)}",
            step="confirm",
            workload_id=external_id,
            args={"expect": "accepted"},
        )
        answer = at_b.run(request)
        return answer if answer.ok or not answer.retryable else None

    good_move = f"shaper-54-{kube.namespace}/job/train"
    good = target.submit(spec, name=good_move)
    accepted = wait_for("the moved job's confirm", lambda: verdict(good))
    assert accepted.ok, accepted.error
    summary = accepted.result["summary"]
    assert any(seen in summary for seen in ("is queued", "quota reserved", "runs: its pods")), (
        summary
    )

    job = dict(spec.native["job"])
    job["metadata"] = {**job["metadata"], "labels": {QUEUE_LABEL: "no-such-queue"}}
    broken_move = f"shaper-55-{kube.namespace}/job/train"
    broken = target.submit(spec.model_copy(update={"native": {"job": job}}), name=broken_move)
    rejected = wait_for("the broken job's confirm", lambda: verdict(broken))
    assert not rejected.ok and not rejected.retryable
    assert "is inadmissible (Inadmissible: LocalQueue no-such-queue doesn't exist)" in (
        rejected.error or ""
    )
    assert target.withdraw(broken_move) == broken
    assert target.withdraw(good_move) == good
