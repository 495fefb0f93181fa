"""A moved Job's Workload that is inactive (connectors.kubernetes.arrival.judge_workload):
held by Shaper, accepted; deactivated by Kueue itself, rejected with Kueue's reason. The
Workloads carry the conditions Kueue v0.17 writes when it deactivates one (its
pkg/workload and workload controller: ``DeactivationTarget`` while it acts, then
``Evicted``/``Requeued`` with reason ``Deactivated`` and ``QuotaReserved`` False), and the
mark the connector's own deactivation writes (connectors.kueue.actions; against a real
Kueue: tests/k8s/test_kueue_moves.py's held submit)."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.base import ConnectorError
from connectors.kubernetes.arrival import judge_workload
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER, STOPPED_BY_STEP

JOB = "ml/job/moved-1"


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _inactive(*conditions: dict[str, str], **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-moved-1-x", "namespace": "ml", "annotations": annotations},
        "spec": {"active": False},
        "status": {"conditions": list(conditions)},
    }


PENDING = _condition("QuotaReserved", "False", "Pending", "The workload is deactivated")


def test_a_workload_shaper_deactivated_is_held_in_the_queue() -> None:
    held = judge_workload(_inactive(PENDING, **{DEACTIVATED_BY_SHAPER: "true"}), JOB)
    assert held == f"job {JOB}'s Workload job-moved-1-x is deactivated by Shaper: held in the queue"


@pytest.mark.parametrize(
    ("conditions", "why"),
    [
        # An AdmissionCheck rejected it: Kueue marks it, then deactivates it.
        (
            [
                _condition(
                    "DeactivationTarget",
                    "True",
                    "AdmissionCheck",
                    "The workload is deactivated due to an AdmissionCheck prov-check Rejected",
                ),
                PENDING,
            ],
            "DeactivationTarget AdmissionCheck: The workload is deactivated due to an "
            "AdmissionCheck prov-check Rejected",
        ),
        # Its requeuing limit reached (PodsReady timeouts): evicted, not requeued.
        (
            [
                _condition(
                    "Evicted",
                    "True",
                    "Deactivated",
                    "The workload is deactivated due to exceeding the maximum number of "
                    "re-queuing retries",
                ),
                _condition("Requeued", "False", "Deactivated", "The workload is deactivated"),
                PENDING,
            ],
            "Evicted Deactivated: The workload is deactivated due to exceeding the maximum "
            "number of re-queuing retries",
        ),
        # Kueue before v0.9 (reason InactiveWorkload), or someone else: what is left.
        ([PENDING], "QuotaReserved Pending: The workload is deactivated"),
        ([], "no condition says why"),
    ],
)
def test_a_workload_kueue_deactivated_is_rejected_with_its_reason(
    conditions: list[dict[str, str]], why: str
) -> None:
    # A step key left from an earlier stop is no hold of Shaper's now: only the mark is.
    workload = _inactive(*conditions, **{STOPPED_BY_STEP: "k-9"})
    with pytest.raises(ConnectorError, match="the scheduler rejected the moved job") as rejected:
        judge_workload(workload, JOB)
    assert not rejected.value.retryable
    assert f"was deactivated, not by Shaper ({why})" in str(rejected.value)


def test_an_admitted_workload_kueue_deactivated_is_rejected_not_judged_by_its_pods() -> None:
    admitted = _inactive(
        _condition("Admitted", "True", "Admitted", "The workload is admitted"),
        _condition("DeactivationTarget", "True", "RequeuingLimitExceeded", "retries exceeded"),
    )
    with pytest.raises(ConnectorError, match="DeactivationTarget RequeuingLimitExceeded"):
        judge_workload(admitted, JOB)
