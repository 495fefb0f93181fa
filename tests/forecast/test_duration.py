"""Block-job duration prediction from finished jobs."""

from __future__ import annotations

import math

import pytest

from forecast.duration import DEFAULT_S, DurationPredictor, JobFeatures


def test_with_no_history_the_estimate_or_the_default_is_the_prediction() -> None:
    predictor = DurationPredictor()
    assert predictor.predict(JobFeatures("a", "training", 1, estimate_s=7200.0)) == 7200.0
    assert predictor.predict(JobFeatures("a", "training", 1)) == DEFAULT_S


def test_it_learns_each_teams_ratio_of_actual_to_estimate() -> None:
    predictor = DurationPredictor()
    for estimate in (3600.0, 7200.0, 14400.0) * 10:
        predictor.observe(JobFeatures("fast", "training", 8, "H100", estimate), 0.5 * estimate)
        predictor.observe(JobFeatures("slow", "training", 8, "H100", estimate), 2.0 * estimate)
    fast = predictor.predict(JobFeatures("fast", "training", 8, "H100", 10000.0))
    slow = predictor.predict(JobFeatures("slow", "training", 8, "H100", 10000.0))
    assert fast == pytest.approx(5000.0, rel=0.15)
    assert slow == pytest.approx(20000.0, rel=0.15)
    # A team it has never seen gets the ratio of everyone (between the two: 1).
    assert predictor.predict(JobFeatures("new", "training", 8, "H100", 10000.0)) == pytest.approx(
        10000.0, rel=0.15
    )


def test_one_odd_job_in_a_new_group_moves_the_prediction_little() -> None:
    predictor = DurationPredictor()
    for _ in range(50):
        predictor.observe(JobFeatures("t", "training", 1), 3600.0)
    predictor.observe(JobFeatures("t", "training", 64, "A100"), 100 * 3600.0)
    predicted = predictor.predict(JobFeatures("t", "training", 64, "A100"))
    # Shrunk toward the team's hour: a geometric mix, far from 100 h.
    assert 3600.0 < predicted < 10 * 3600.0


def test_the_error_is_scored_before_learning() -> None:
    predictor = DurationPredictor()
    job = JobFeatures("t", "training", 1)
    predictor.observe(job, 2 * 3600.0)  # predicted DEFAULT_S (1 h): 1 h off, 50 %
    predictor.observe(job, 2 * 3600.0)  # predicted 2 h: exact
    assert predictor.error.count == 2
    assert predictor.error.mae_s == pytest.approx(1800.0)
    assert predictor.error.mape == pytest.approx(0.25)
    assert predictor.error_by_team()["t"].count == 2
    assert math.isnan(DurationPredictor().error.mae_s)
