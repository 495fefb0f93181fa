"""A moved Job its ``activeDeadlineSeconds`` ended (connectors.kubernetes.arrival.took_place):
the Job controller counts the pods it ends at the deadline in ``status.failed``, those
still Pending too, so only a pod seen to have started says the Job ran; so with pods the
kubelet refused at admission (``BackoffLimitExceeded``). The objects are built as the API
server serves them for such a Job (Failed, reason DeadlineExceeded or BackoffLimitExceeded)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from connectors.base import ConnectorError
from connectors.kubernetes.arrival import judge_job, pod_started, took_place

JOB = "ml/job/moved-1"
T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)


def _ended(reason: str, **counts: int) -> Any:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="moved-1", namespace="ml", uid="u1"),
        spec=client.V1JobSpec(template=client.V1PodTemplateSpec(), active_deadline_seconds=60),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(
                    type="Failed",
                    status="True",
                    reason=reason,
                    message="Job was active longer than specified deadline",
                )
            ],
            **counts,
        ),
    )


def _pod(state: client.V1ContainerState | None, *, phase: str = "Failed") -> Any:
    statuses = None
    if state is not None:
        statuses = [
            client.V1ContainerStatus(
                name="main", image="train:1", image_id="", ready=False, restart_count=0, state=state
            )
        ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="moved-1-a", namespace="ml"),
        spec=client.V1PodSpec(containers=[]),
        status=client.V1PodStatus(phase=phase, container_statuses=statuses),
    )


WAITING = client.V1ContainerState(
    waiting=client.V1ContainerStateWaiting(reason="ContainerCreating")
)
# What the kubelet reports for a container it never started, once its pod is deleted.
NEVER_STARTED = client.V1ContainerState(
    terminated=client.V1ContainerStateTerminated(exit_code=137, reason="ContainerStatusUnknown")
)
RAN = client.V1ContainerState(
    terminated=client.V1ContainerStateTerminated(
        exit_code=137, reason="Error", started_at=T0, finished_at=T0
    )
)
RUNNING = client.V1ContainerState(running=client.V1ContainerStateRunning(started_at=T0))


def test_a_job_its_deadline_ended_while_its_pods_were_pending_did_not_take_place() -> None:
    # failed=2 counts the two pods the deadline ended in the queue: they never ran.
    job = _ended("DeadlineExceeded", failed=2)
    assert took_place(job) is None  # its pods deleted: nothing says it ran
    assert took_place(job, [_pod(WAITING, phase="Pending"), _pod(NEVER_STARTED)]) is None
    error = pytest.raises(ConnectorError, judge_job, job, [_pod(WAITING, phase="Pending")], JOB)
    assert not error.value.retryable
    assert "ended (Failed: Job was active longer than specified deadline) before any pod ran" in (
        str(error.value)
    )


@pytest.mark.parametrize("state", [RAN, RUNNING])
def test_a_job_its_deadline_ended_after_a_pod_started_took_place(
    state: client.V1ContainerState,
) -> None:
    # A pod that failed on its own before the deadline stays listed; one the deadline ends
    # while it runs is listed until it has terminated.
    job = _ended("DeadlineExceeded", failed=2)
    assert took_place(job, [_pod(WAITING, phase="Pending"), _pod(state)]) == "Failed"
    assert "the move took place" in judge_job(job, [_pod(state)], JOB)


def test_a_started_container_is_told_from_its_state_or_its_last_state() -> None:
    assert not pod_started(_pod(None))  # rejected by the kubelet: no container ever
    assert not pod_started(_pod(WAITING, phase="Pending"))
    assert pod_started(_pod(RUNNING, phase="Running"))
    restarted = _pod(WAITING, phase="Pending")
    restarted.status.container_statuses[0].last_state = RAN
    assert pod_started(restarted)


def _refused_at_admission() -> Any:
    """A pod the kubelet failed at admission (a device plugin's GPUs gone): no container."""
    pod = _pod(None)
    pod.status.reason = "UnexpectedAdmissionError"
    pod.status.message = "Allocate failed due to no healthy devices present"
    return pod


def test_a_job_whose_every_pod_failed_at_admission_did_not_take_place() -> None:
    # backoffLimit 6: seven pods failed, none ever started a container.
    job = _ended("BackoffLimitExceeded", failed=7)
    pods = [_refused_at_admission() for _ in range(7)]
    assert took_place(job, pods) is None
    error = pytest.raises(ConnectorError, judge_job, job, pods, JOB)
    assert not error.value.retryable
    assert "before any pod ran" in str(error.value)
    # One pod that started among them: the Job ran, its failure is its own.
    assert took_place(job, [*pods, _pod(RAN)]) == "Failed"


def test_without_pods_failures_are_judged_by_their_counts() -> None:
    # No pod listed (deleted since): a failed count other than a deadline's is a run.
    assert took_place(_ended("BackoffLimitExceeded", failed=3)) == "Failed"
    assert took_place(_ended("DeadlineExceeded", failed=1, succeeded=1)) == "Failed"
    assert took_place(_ended("BackoffLimitExceeded")) is None
