"""How the Kubernetes and Kueue connectors judge the copy a pending job's move created
(connectors.kubernetes.arrival): from the Job, its pods and its Workload as the API server
serves them, each case a state the confirm meets before the home copy is cancelled. (The
same judgment against a real API server and Kueue: tests/k8s/test_kubernetes_moves.py,
tests/k8s/test_kueue_moves.py.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from connectors.base import ConnectorError
from connectors.kubernetes.arrival import judge_job, judge_workload, took_place
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER

JOB = "ml/job/moved-1"


def _job(*, suspend: bool = False, conditions: tuple[str, ...] = (), **counts: int) -> Any:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="moved-1", namespace="ml", uid="u1"),
        spec=client.V1JobSpec(suspend=suspend, template=client.V1PodTemplateSpec()),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(type=c, status="True", message=f"{c} says so")
                for c in conditions
            ],
            **counts,
        ),
    )


def _pod(name: str = "moved-1-a", *, node: str | None = None, waiting: str | None = None) -> Any:
    statuses = None
    if waiting is not None:
        statuses = [
            client.V1ContainerStatus(
                name="main",
                image="train:1",
                image_id="",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    waiting=client.V1ContainerStateWaiting(reason=waiting, message="why")
                ),
            )
        ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ml"),
        spec=client.V1PodSpec(containers=[], node_name=node),
        status=client.V1PodStatus(phase="Pending", container_statuses=statuses),
    )


def _rejected(call: Any) -> ConnectorError:
    with pytest.raises(ConnectorError) as raised:
        call()
    assert not raised.value.retryable, raised.value
    assert "the scheduler rejected the moved job" in str(raised.value)
    return raised.value


def _not_yet(call: Any) -> ConnectorError:
    with pytest.raises(ConnectorError) as raised:
        call()
    assert raised.value.retryable, raised.value
    return raised.value


def test_a_job_whose_pods_wait_for_the_scheduler_or_run_is_accepted() -> None:
    assert (
        judge_job(_job(), [_pod()], JOB) == f"job {JOB} is pending: its pods wait for the scheduler"
    )
    running = judge_job(_job(), [_pod(node="gpu-2"), _pod("moved-1-b", node="gpu-1")], JOB)
    assert running == f"job {JOB} runs: its pods are on gpu-1,gpu-2"
    assert judge_job(_job(suspend=True), [], JOB) == f"job {JOB} is suspended: held in the queue"


def test_a_job_without_pods_or_still_pulling_its_image_is_not_yet_known() -> None:
    assert "has no pod yet" in str(_not_yet(lambda: judge_job(_job(), [], JOB)))
    pulling = _not_yet(lambda: judge_job(_job(), [_pod(node="g", waiting="ImagePullBackOff")], JOB))
    assert "pod moved-1-a is ImagePullBackOff" in str(pulling)
    deleted = _pod()
    deleted.metadata.deletion_timestamp = datetime(2026, 12, 4, tzinfo=UTC)
    _not_yet(lambda: judge_job(_job(), [deleted], JOB))  # a pod on its way out is none
    # Admitted by Kueue and not resumed yet: its pods are about to come.
    assert "not yet resumed" in str(
        _not_yet(lambda: judge_job(_job(suspend=True), [], JOB, admitted=True))
    )


@pytest.mark.parametrize("reason", ["CreateContainerConfigError", "InvalidImageName"])
def test_a_job_whose_containers_cannot_be_created_is_rejected(reason: str) -> None:
    error = _rejected(lambda: judge_job(_job(), [_pod(node="g", waiting=reason)], JOB))
    assert f"container main of pod moved-1-a cannot start ({reason}: why)" in str(error)


def test_a_job_that_ran_is_accepted_and_one_that_ended_before_any_pod_ran_is_rejected() -> None:
    assert "ran here and ended (Complete)" in judge_job(_job(conditions=("Complete",)), [], JOB)
    failed_after_running = judge_job(_job(conditions=("Failed",), failed=1), [], JOB)
    assert "the move took place" in failed_after_running
    error = _rejected(lambda: judge_job(_job(conditions=("Failed",)), [], JOB))
    assert "ended (Failed: Failed says so) before any pod ran" in str(error)


def _workload(*conditions: tuple[str, str, str], active: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-moved-1-x", "namespace": "ml"},
        "spec": {"active": active},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{r} message"}
                for t, s, r in conditions
            ]
        },
    }


def test_a_workload_waiting_for_quota_is_queued_and_an_inadmissible_one_rejected() -> None:
    queued = judge_workload(_workload(("QuotaReserved", "False", "Pending")), JOB)
    assert queued == f"job {JOB}'s Workload job-moved-1-x is queued (Pending: Pending message)"
    error = _rejected(
        lambda: judge_workload(_workload(("QuotaReserved", "False", "Inadmissible")), JOB)
    )
    assert "is inadmissible (Inadmissible: Inadmissible message)" in str(error)
    assert "not been considered" in str(_not_yet(lambda: judge_workload(_workload(), JOB)))
    held = _workload(("QuotaReserved", "False", "Pending"), active=False)
    held["metadata"]["annotations"] = {DEACTIVATED_BY_SHAPER: "true"}  # Shaper's hold
    assert "deactivated by Shaper: held" in (judge_workload(held, JOB) or "")
    # Admitted or finished: the Job and its pods say the rest.
    assert judge_workload(_workload(("Admitted", "True", "Admitted")), JOB) is None
    assert judge_workload(_workload(("Finished", "True", "JobFinished")), JOB) is None


def test_a_job_that_ended_before_any_pod_ran_did_not_take_place() -> None:
    # What the withdraw of a rejected copy asks: a Job that failed (a deadline) before any
    # pod ran did no work, so it may be deleted and the source copy released; one whose
    # pod ran, or that completed, took place and must not be undone.
    assert took_place(_job(conditions=("Failed",))) is None
    assert took_place(_job(conditions=("Failed",), failed=1)) == "Failed"
    assert took_place(_job(conditions=("Complete",), succeeded=1)) == "Complete"
    assert took_place(_job()) is None
