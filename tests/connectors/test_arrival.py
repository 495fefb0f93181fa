"""The rule a move's confirm applies to a connector's report of the copy it submitted
(connectors.arrival.check_reported): what is accepted, what is not yet known, what was
rejected — over the reports Slurm and the simulated clusters make."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from connectors.arrival import check_reported
from connectors.base import ConnectorError
from wire.telemetry import JobReport, JobState

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)


def _copy(state: JobState, **fields: Any) -> JobReport:
    return JobReport(external_id="77", gpus_requested=4, state=state, **fields)


@pytest.mark.parametrize(
    ("report", "seen"),
    [
        (_copy(JobState.pending, reason="Resources"), "job 77 is pending (Resources)"),
        (_copy(JobState.pending, reason="JobHeldUser"), "job 77 is pending (JobHeldUser)"),
        (_copy(JobState.running, start_time=T0), "job 77 is running"),
        (
            _copy(JobState.finished, start_time=T0, end_time=T0 + timedelta(hours=1)),
            "job 77 is finished",
        ),
        # Its own failure once it ran: the move took place (withdraw says so too).
        (
            _copy(JobState.failed, start_time=T0, end_time=T0 + timedelta(minutes=3)),
            "job 77 is failed, after it ran here: the move took place",
        ),
    ],
)
def test_a_copy_queued_running_or_having_run_is_accepted(report: JobReport, seen: str) -> None:
    assert check_reported(report, "77").startswith(seen)


@pytest.mark.parametrize(
    ("report", "said"),
    [
        (_copy(JobState.failed, reason="InvalidImage"), "failed (InvalidImage) without having run"),
        # Slurm gives a job cancelled in its queue a start time equal to its end.
        (_copy(JobState.cancelled, start_time=T0, end_time=T0), "cancelled without having run"),
        (_copy(JobState.pending, reason="BadConstraints"), "a reason no wait resolves"),
        (_copy(JobState.pending, reason="InvalidQOS"), "a reason no wait resolves"),
    ],
)
def test_a_copy_that_ended_before_it_ran_or_never_will_run_is_rejected_for_good(
    report: JobReport, said: str
) -> None:
    with pytest.raises(ConnectorError, match="the scheduler rejected the moved job") as rejected:
        check_reported(report, "77")
    assert said in str(rejected.value) and not rejected.value.retryable


def test_a_copy_the_scheduler_does_not_list_yet_is_not_yet_known() -> None:
    with pytest.raises(ConnectorError, match="does not report job 77 yet") as unknown:
        check_reported(None, "77")
    assert unknown.value.retryable
