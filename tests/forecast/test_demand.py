"""Service demand forecasts on synthetic series with a known daily cycle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.tsa.exponential_smoothing.initialization import _initialization_heuristic

from forecast import demand as fd

DAY = fd.SEASON


def _daily(days: int, *, noise: float, seed: int = 0, level: float = 10.0) -> list[float]:
    rng = np.random.default_rng(seed)
    hours = np.arange(days * DAY)
    cycle = level + 5.0 * np.sin(2 * np.pi * hours / DAY)
    return [float(v) for v in cycle + rng.normal(0.0, noise, len(hours))]


def _backtest(
    series: list[float], history: int, steps: int, quantile: float
) -> tuple[float, float, float]:
    """(ETS MAE, seasonal-naive MAE, ETS coverage of ``quantile``) over hourly origins."""
    ets_errors, naive_errors, covered = [], [], []
    forecaster = fd.DemandForecaster()
    for origin in range(history, len(series) - steps):
        past, actual = series[origin - history : origin], series[origin : origin + steps]
        ets = forecaster.forecast("s", past, steps, now=origin * 3600.0, quantile=quantile)
        naive = fd.seasonal_naive(past, steps)
        for h in range(steps):
            ets_errors.append(abs(ets.mean[h] - actual[h]))
            naive_errors.append(abs(naive[h] - actual[h]))
            covered.append(actual[h] <= ets.upper[h])
    return float(np.mean(ets_errors)), float(np.mean(naive_errors)), float(np.mean(covered))


def test_ets_beats_seasonal_naive_on_a_noisy_daily_cycle() -> None:
    series = _daily(10, noise=1.0)
    ets_mae, naive_mae, _ = _backtest(series, history=7 * DAY, steps=6, quantile=0.9)
    # Seasonal-naive carries yesterday's noise into today: about √2 × σ × √(2/π) ≈ 1.13.
    # ETS starts from a season averaged over every day of the week (``initial_states``) and
    # keeps the noise of its level: about 0.88 here (0.93 with statsmodels' heuristic, which
    # stops at five days; 0.80 would be knowing the cycle exactly).
    assert ets_mae < 0.95 * naive_mae


def test_prediction_interval_covers_near_its_nominal_quantile() -> None:
    series = _daily(12, noise=1.0, seed=3)
    _, _, coverage = _backtest(series, history=7 * DAY, steps=6, quantile=0.9)
    assert 0.8 <= coverage <= 0.97


def test_upper_is_above_the_mean_and_grows_with_the_quantile() -> None:
    series = _daily(7, noise=1.0)
    low = fd.forecast_demand(series, 6, quantile=0.6)
    high = fd.forecast_demand(series, 6, quantile=0.95)
    assert low.method is fd.Method.ets
    assert all(u >= m for u, m in zip(low.upper, low.mean, strict=True))
    assert all(h > lo for h, lo in zip(high.upper, low.upper, strict=True))


def test_a_too_short_history_falls_back_to_seasonal_naive_then_to_the_latest() -> None:
    series = _daily(7, noise=0.0)
    day_and_a_half = series[: DAY + DAY // 2]
    fallback = fd.forecast_demand(day_and_a_half, 3)
    assert fallback.method is fd.Method.seasonal_naive
    assert list(fallback.mean) == day_and_a_half[DAY // 2 : DAY // 2 + 3]
    hours = series[:10]
    latest = fd.forecast_demand(hours, 3)
    assert latest.method is fd.Method.latest
    assert latest.mean == latest.upper == (hours[-1],) * 3
    forecaster = fd.DemandForecaster()
    assert forecaster.forecast("s", hours, 3, now=0.0).method is fd.Method.latest
    assert forecaster.fits == 0


def test_a_flat_series_gives_a_flat_forecast_without_warnings() -> None:
    forecast = fd.forecast_demand([4.0] * (3 * DAY), 6, quantile=0.99)
    assert forecast.method is fd.Method.ets
    assert forecast.mean == pytest.approx((4.0,) * 6)
    assert forecast.upper == pytest.approx((4.0,) * 6, abs=1e-6)


def test_the_forecaster_refits_at_most_every_refit_s() -> None:
    series = _daily(8, noise=1.0)
    forecaster = fd.DemandForecaster(refit_s=6 * 3600.0)
    first = forecaster.forecast("s", series[:-3], 6, now=0.0)
    assert forecaster.fits == 1
    assert forecaster.forecast("s", series[:-3], 6, now=30.0) is first  # unchanged series
    grown = forecaster.forecast("s", series[:-2], 6, now=3600.0)  # filtered, not refitted
    assert forecaster.fits == 1 and grown != first
    assert not any(math.isnan(v) for v in grown.upper)
    forecaster.forecast("s", series[:-1], 6, now=9 * 3600.0)  # stale: at most 1.5 × refit_s
    assert forecaster.fits == 2
    forecaster.forecast("t", series, 6, now=9 * 3600.0)
    forecaster.forget({"t"})
    forecaster.forecast("s", series, 6, now=9 * 3600.0 + 1)
    assert forecaster.fits == 4  # s was forgotten: fitted afresh


def test_hourly_series_means_fills_gaps_and_leaves_the_current_hour_out() -> None:
    samples = [(0.0, 1.0), (1800.0, 3.0), (2 * 3600.0 + 5, 5.0), (3 * 3600.0 + 10, 9.0)]
    assert fd.hourly_series(samples, end=3 * 3600.0 + 60) == [2.0, 2.0, 5.0]
    assert fd.hourly_series([], end=3600.0) == []


@pytest.mark.parametrize(
    ("target", "quantile"), [(None, fd.DEFAULT_QUANTILE), (1.0, 0.99), (0.95, 0.95), (0.2, 0.5)]
)
def test_the_quantile_follows_the_sla_demand_target(target: float | None, quantile: float) -> None:
    assert fd.quantile_for(target) == quantile


def test_a_series_ets_cannot_take_falls_back_and_old_fits_are_dropped() -> None:
    """A wild spike (1e300 replicas) in a service's history must not stop the cycle: the
    forecast falls back to seasonal-naive and stays finite; a service not asked about for
    two refit periods loses its fit."""
    forecaster = fd.DemandForecaster(refit_s=3600)
    calm = [2.0 + (h % 24 == 12) for h in range(24 * 3)]
    wild = [*calm[:-1], 1e300]
    ahead = forecaster.forecast("wild", wild, 6, now=0.0, quantile=0.9)
    assert all(math.isfinite(v) for v in (*ahead.mean, *ahead.upper))
    assert ahead.method is fd.Method.seasonal_naive
    forecaster.forecast("calm", calm, 6, now=0.0, quantile=0.9)
    assert "calm" in forecaster._fits
    forecaster.forecast("other", calm, 6, now=3 * 3600.0, quantile=0.9)
    assert "calm" not in forecaster._fits and "other" in forecaster._fits


def test_the_initial_states_are_statsmodels_heuristic_while_it_sees_every_day() -> None:
    """Up to five days statsmodels' heuristic already averages every day: the same states."""
    values = np.asarray(_daily(5, noise=1.0, seed=4))
    level, seasonal = fd.initial_states(values, DAY)
    expected_level, _, expected_seasonal = _initialization_heuristic(
        values, seasonal="add", seasonal_periods=DAY
    )
    assert level == pytest.approx(expected_level)
    assert seasonal == pytest.approx(expected_seasonal)


def test_the_initial_season_averages_every_day_of_a_longer_history() -> None:
    """statsmodels' heuristic stops at the first five days; the fitted γ of a steady cycle is
    about 0, so whatever days 6 and 7 hold would never reach the forecast's season. Here
    seven extra replicas on day 6 at noon move noon's season by about 7/6: noon's season is
    the mean over the six days whose noon has a centred moving average, one of them day 6."""
    steady = np.asarray(_daily(7, noise=0.0))
    bumped = steady.copy()
    bumped[5 * DAY + 12] += 7.0  # day 7's noon has no centred moving average
    _, before = fd.initial_states(steady, DAY)
    _, after = fd.initial_states(bumped, DAY)
    # 7 × 23/24 / 6: the moving average around the bump takes 1/24 of it.
    assert after[12] - before[12] == pytest.approx(7 * 23 / 24 / 6, abs=0.02)
    forecast = fd.forecast_demand(list(bumped), DAY, quantile=0.9)
    baseline = fd.forecast_demand(list(steady), DAY, quantile=0.9)
    assert forecast.mean[12] - baseline.mean[12] > 0.5


def _multiplicative(days: int, *, noise: float, seed: int = 0) -> list[float]:
    """A daily cycle of 1 to 6 replicas × (1 + noise · z): the noise of ``Service``."""
    rng = np.random.default_rng(seed)
    hours = np.arange(days * DAY)
    cycle = 3.5 - 2.5 * np.cos(2 * np.pi * hours / DAY)  # 1 at midnight, 6 at noon
    return [float(v) for v in cycle * (1.0 + noise * rng.normal(size=len(hours)))]


def _coverage_by_hour(
    series: list[float], error: fd.ErrorForm, hours: set[int]
) -> tuple[float, float]:
    """(0.99 coverage at ``hours`` of the day, elsewhere), 7-day window, hourly origins."""
    forecaster = fd.DemandForecaster(error=error)
    inside: list[bool] = []
    outside: list[bool] = []
    history = 7 * DAY
    for origin in range(history, len(series) - 6):
        ahead = forecaster.forecast(
            "s", series[origin - history : origin], 6, now=origin * 3600.0, quantile=0.99
        )
        for h in range(6):
            at = origin + h
            (inside if at % DAY in hours else outside).append(series[at] <= ahead.upper[h])
    return float(np.mean(inside)), float(np.mean(outside))


def test_the_multiplicative_form_widens_the_interval_with_the_level() -> None:
    """In ETS(M,N,A) the error is a ratio of the mean, and so is the interval: about six
    times as wide at the noon peak (6 replicas) as at midnight (1). The additive form's
    width is one σ for all."""
    series = _multiplicative(7, noise=0.2)
    widths = {}
    for error in fd.ErrorForm:
        ahead = fd.forecast_demand(series, DAY, quantile=0.99, error=error)
        assert ahead.method is fd.Method.ets
        widths[error] = [u - m for u, m in zip(ahead.upper, ahead.mean, strict=True)]
    mul = widths[fd.ErrorForm.multiplicative]
    add = widths[fd.ErrorForm.additive]
    assert mul[12] > 4 * mul[0]
    assert add[12] < 1.5 * add[0]


def test_the_multiplicative_interval_covers_the_peak_hours_of_multiplicative_noise() -> None:
    """The additive form's one σ is too wide at night and too narrow at the peak, where
    the replicas matter; the multiplicative form's 0.99 quantile holds near it at both
    (97 % and 97 % here, against 91 % and 98 %: a σ from the fit's own residuals is a
    little short of the truth in either form)."""
    series = _multiplicative(21, noise=0.2, seed=5)
    peak = {9, 10, 11, 12, 13, 14, 15}
    mul_peak, mul_rest = _coverage_by_hour(series, fd.ErrorForm.multiplicative, peak)
    assert mul_peak >= 0.95 and mul_rest >= 0.95
    add_peak, add_rest = _coverage_by_hour(series, fd.ErrorForm.additive, peak)
    assert add_peak < mul_peak - 0.03 and add_rest > add_peak + 0.03


def test_a_zero_hour_keeps_the_additive_form_until_it_leaves_the_window() -> None:
    """A series with a zero-demand hour is fitted in the additive form (statsmodels, like
    R's ``ets``, refuses a multiplicative error on data that is not strictly positive);
    the fit kept for the other form is not reused across the switch."""
    series = _multiplicative(8, noise=0.1, seed=2)
    series[DAY + 3] = 0.0
    forecaster = fd.DemandForecaster(error=fd.ErrorForm.multiplicative)
    window = 7 * DAY
    with_zero = forecaster.forecast("s", series[:window], 6, now=0.0, quantile=0.99)
    expected = fd.forecast_demand(series[:window], 6, quantile=0.99, error=fd.ErrorForm.additive)
    assert with_zero == expected
    assert not forecaster._fits["s"].relative
    later = series[DAY + 4 : DAY + 4 + window]  # the zero has left the window
    forecaster.forecast("s", later, 6, now=3600.0, quantile=0.99)
    assert forecaster.fits == 2 and forecaster._fits["s"].relative


# A step-shaped daily curve like the simulator's embeddings services (1 to 3 replicas,
# peak in the evening), scaled so that no hour is near zero.
STEP_CURVE = 4.0 * np.array([1.0] * 10 + [2.0] * 8 + [3.0] * 4 + [2.0, 1.0])


def _step_days(days: int, *, noise: float, seed: int) -> np.ndarray:
    """``days`` of ``STEP_CURVE`` × (1 + noise · z), the noise of ``Service``."""
    rng = np.random.default_rng(seed)
    hours = np.arange(days * DAY)
    return STEP_CURVE[hours % DAY] * (1.0 + noise * rng.normal(size=len(hours)))


def test_the_forecast_recovers_a_known_daily_curve_within_the_error_of_its_mean() -> None:
    """Over 14 days each hour of the forecast day lies within 4 standard errors of that
    hour's mean over the window (σ_h / √14) of the true curve: 2.0 here, 3.3 at worst over
    30 seeds. Seasonal-naive (yesterday's noise) is 5.5 to 12 of them away at its worst
    hour over the same seeds, the latest value or a trend further still."""
    noise = 0.1
    series = _step_days(14, noise=noise, seed=7)
    forecast = fd.forecast_demand([float(v) for v in series], DAY, quantile=0.9)
    assert forecast.method is fd.Method.ets
    standard_error = noise * STEP_CURVE / math.sqrt(14)
    assert np.all(np.abs(np.asarray(forecast.mean) - STEP_CURVE) < 4 * standard_error)
    naive = np.asarray(fd.seasonal_naive([float(v) for v in series], DAY))
    assert np.any(np.abs(naive - STEP_CURVE) >= 4 * standard_error)


def test_a_longer_history_brings_the_forecast_closer_to_the_known_curve() -> None:
    """The error of an hour's mean falls as 1/√days: over a week of hourly origins the
    forecast from 14 days is nearer the curve than the one from 7 (about √(7/14) ≈ 0.71 of
    its distance in expectation; 0.65 here). A forecaster that used only the last week of
    what it is given would score 1."""
    series = [float(v) for v in _step_days(21, noise=0.2, seed=3)]
    distance: dict[int, list[float]] = {7: [], 14: []}
    for days, errors in distance.items():
        forecaster = fd.DemandForecaster()
        for origin in range(14 * DAY, 21 * DAY - 6, 3):
            ahead = forecaster.forecast(
                "s", series[origin - days * DAY : origin], 6, now=origin * 3600.0, quantile=0.9
            )
            truth = STEP_CURVE[np.arange(origin, origin + 6) % DAY]
            errors.extend(np.abs(np.asarray(ahead.mean) - truth))
    assert np.mean(distance[14]) < 0.85 * np.mean(distance[7])
