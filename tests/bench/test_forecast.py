"""The demand backtest of bench.forecast: a longer history changes what the forecaster
sees and nothing else."""

from __future__ import annotations

from dataclasses import replace

from bench.forecast import backtest_service
from sim.scenario import load_scenario


def test_a_longer_history_scores_the_same_hours_against_the_same_baseline() -> None:
    """The history reaches back before the first day (negative hours), so the seasonal-naive
    baseline and the known curve score exactly as before and only the forecast moves: here
    closer to the curve (the mean of 14 days, not 7, for each hour's season)."""
    spec = next(s for s in load_scenario("mixed").services if s.id == "embeddings")
    service = replace(spec, demand_noise=0.1, noise_seed=1)
    week = backtest_service(service, 7, 0.99)
    fortnight = backtest_service(service, 7, 0.99, history_days=14)
    for at in (1, 3):  # seasonal-naive, the known curve
        assert fortnight[at].abs_errors == week[at].abs_errors
        assert fortnight[at].covered == week[at].covered
    assert len(fortnight[0].abs_errors) == len(week[0].abs_errors) == 7 * 24 * 6
    assert fortnight[0].mae < week[0].mae
    # The known curve is the floor neither history reaches.
    assert week[3].mae < fortnight[0].mae
