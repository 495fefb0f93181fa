"""Service demand forecasts: exponential smoothing (ETS) with prediction intervals, and the
seasonal-naive baseline it replaces.

Demand is a series of hourly means (``hourly_series``) with a daily season of 24 steps.
The model is ETS(A,N,A) from statsmodels — additive error, no trend, additive daily
season — with its initial level and season from the data, not optimised (no search over 25
initial states, so a fit takes milliseconds, not half a second): statsmodels'
``heuristic`` (Hyndman et al., *Forecasting with exponential smoothing*, section 2.6), but
over *every* full day of the history instead of its first five (``initial_states``). The
fitted seasonal smoothing γ comes out about 0 — on a steady daily cycle and, as measured,
even on one whose shape changes (the fit raises α instead) — so the season the forecast
carries is that initial one: averaged over the first five days of a week it kept their
noise in every forecast (16 % lower MAE than seasonal-naive in ``bench.forecast`` at
noise 0.1 and 0.2), over all seven 21 %; a season that changes inside the window also
reaches the forecast sooner when every day counts.
A trend is left out on purpose: a service's demand is a level and a daily cycle, and an
extrapolated trend over six hours on a week of history is noise more often than signal.

What the solver gets is not the mean but a *quantile* of the forecast distribution: the
replicas that cover demand with probability ``quantile`` (the service's SLA demand target,
``quantile_for``). ETS(A,N,A) has an exact forecast variance (Hyndman & Athanasopoulos,
*Forecasting: principles and practice*, 3rd ed., table 8.8):
``σ² [1 + α²(h−1) + γ k (2α + γ)]`` with ``k = ⌊(h−1)/m⌋`` — computed here from the fitted
α, γ and residual variance, because statsmodels 0.15's ``get_prediction`` fails on
array input.

Error form (``ErrorForm``, ``DEFAULT_ERROR``; additive unless told). Demand is positive
and its noise grows with it (the simulator's is the hour's demand × (1 + noise · z)), so
the multiplicative form, ETS(M,N,A) — the same level and additive season, the error a
ratio of the step's mean — is the model that matches; ``_mna_upper`` gives its quantile.
It was measured in ``bench.forecast --error multiplicative`` and is not the default: the
point forecast is the same to 0.1 point of skill (the season is the initial one either
way, γ ≈ 0), and the interval, right at the peak hours where the additive one's single σ
is too narrow (0.99 covered 98 % of peak hours against 94 %), gives back more at the
quiet hours, 97.2 % of all hours against 98.1 % (README, "Forecasts"). Fitting additive
ETS on log demand was measured too and dropped: log-normal tails are longer than the
noise's, 0.99 covered 99.4–100 % and reserved 6 % more. A series with a zero-demand hour
is fitted in the additive form: statsmodels, like R's ``ets``, takes a multiplicative
error for strictly positive data only (a zero hour says the noise is not all relative,
and would be log 0 in the log form); the fit is redone when a zero enters or leaves the
window.

Too little history for ETS (fewer than two full days: the heuristic initialisation needs
two seasons to separate level from season) falls back to seasonal-naive (one day), and
less than a day to the latest value: a forecast is never refused, it only gets simpler.

History window (``HISTORY_DAYS``, 14: the days of hourly means the shaping
snapshot reads and the simulator hands its forecaster). With γ ≈ 0 the forecast's season
is close to each hour's mean over the window, so its error has two parts: the hour's own
noise, which no forecast removes, and the error of that mean, which falls with the days
averaged. Seasonal-naive's error is the difference of two noisy hours; against it a
forecast that knew the mean curve would gain 1 − 1/√2 ≈ 29 % (Gaussian noise), and an
hour's mean over n days, no more than 1 − √((1 + 1/n)/2) in expectation: 24 % at 7 days,
27 % at 14. On one backtest's draws that figure scatters by about 4 points, so a 20 % goal
on every service is missed now and then at 7 days whatever the estimator (``bench.forecast``
prints the known curve's gain next to the forecast's as ``floor``: 24.3 % and 26.7 % on
the two embeddings services, where the forecast from 7 days gains 17.1 % and 19.8 %, and
28–31 % on the others).
Hence 14 days (``bench.forecast --history-days 7`` gives the old window): 27.6 %
overall against 21.0 % at 7, every service 22.4–29.0 %, the 0.99 quantile covering 98.5 % of
hours against 98.1 % with fewer replicas reserved (README, "Forecasts"). What a longer
window costs: a change in the daily shape enters the season at 1/n a day, and the snapshot
reads twice the rows; a fit took as long as on 7 days, within the noise of 2 shared cores.

Fit cost: ``DemandForecaster`` keeps one fit per service. The smoothing parameters are
re-estimated at most every ``refit_s`` seconds (up to 1.5 × that, staggered per service, so
that the fits of a restart do not all fall due in one cycle again); in between, a grown
series is only filtered with the parameters it has (``ETSModel.smooth``: one pass, no
optimiser), and an unchanged series reuses the last forecast outright — the shaping cycle
runs every 30 s and an hourly series changes once an hour. Timed once by hand on 2 busy
cores, 300 services with a week of history: about 10 s for the first cycle's fits, 1.2 s
when every series has grown by an hour, 15 ms when none has.
"""

from __future__ import annotations

import logging
import math
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist

import numpy as np
from statsmodels.tools.sm_exceptions import ConvergenceWarning
from statsmodels.tsa.exponential_smoothing.ets import ETSModel

logger = logging.getLogger(__name__)

SEASON = 24  # hourly steps in a day
STEP_S = 3600
MIN_ETS_SEASONS = 2
# The quantile a service gets when its SLA names no demand target, and the bounds of any
# target: 1.0 would ask for an infinite upper bound; below the median is not a guarantee.
DEFAULT_QUANTILE = 0.9
MAX_QUANTILE = 0.99
MIN_QUANTILE = 0.5
REFIT_S = 6 * 3600.0
# The days of hourly means a forecast is given (module docstring, "History window"): the
# window the shaping snapshot reads and the simulator hands its forecaster.
HISTORY_DAYS = 14


class ErrorForm(StrEnum):
    """How the noise enters the model (module docstring, "Error form")."""

    additive = "additive"  # ETS(A,N,A) on the demand
    multiplicative = "multiplicative"  # ETS(M,N,A): the error a ratio of the mean


# The form ``DemandForecaster`` and ``forecast_demand`` use unless told.
DEFAULT_ERROR = ErrorForm.additive


class Method(StrEnum):
    ets = "ets"
    seasonal_naive = "seasonal-naive"
    latest = "latest"


@dataclass(frozen=True, slots=True)
class DemandForecast:
    """``mean[h]`` and ``upper[h]`` (the ``quantile``) for ``h`` = 1 … steps ahead of the
    series' last value."""

    mean: tuple[float, ...]
    upper: tuple[float, ...]
    quantile: float
    method: Method


def quantile_for(demand_target: float | None) -> float:
    """The forecast quantile a service's SLA demand target asks for (clamped)."""
    if demand_target is None:
        return DEFAULT_QUANTILE
    return min(MAX_QUANTILE, max(MIN_QUANTILE, demand_target))


def hourly_series(
    samples: Sequence[tuple[float, float]], *, end: float, step_s: int = STEP_S
) -> list[float]:
    """Step means of ``(epoch seconds, value)`` samples, oldest first, over the complete
    steps before ``end`` (steps are aligned to multiples of ``step_s``). A step without a
    sample repeats the one before (telemetry gaps are outages of the sampler, not of the
    demand); steps before the first sample are left out."""
    last = math.floor(end / step_s)  # the step ``end`` falls in: not complete, left out
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for at, value in samples:
        step = math.floor(at / step_s)
        if step >= last:
            continue
        sums[step] = sums.get(step, 0.0) + value
        counts[step] = counts.get(step, 0) + 1
    if not sums:
        return []
    series: list[float] = []
    for step in range(min(sums), last):
        if step in sums:
            series.append(sums[step] / counts[step])
        else:
            series.append(series[-1])
    return series


def seasonal_naive(series: Sequence[float], steps: int, season: int = SEASON) -> list[float]:
    """The value one season before each future step; the latest value while there is less
    than a season of history."""
    if not series:
        return []
    if len(series) < season:
        return [float(series[-1])] * steps
    return [float(series[len(series) - season + (h % season)]) for h in range(steps)]


def _ana_upper(
    mean: np.ndarray, *, alpha: float, gamma: float, sigma2: float, season: int, quantile: float
) -> np.ndarray:
    h = np.arange(1, len(mean) + 1)
    k = (h - 1) // season
    variance = sigma2 * (1 + alpha**2 * (h - 1) + gamma * k * (2 * alpha + gamma))
    z = NormalDist().inv_cdf(quantile)
    result: np.ndarray = mean + z * np.sqrt(np.maximum(variance, 0.0))
    return result


def _mna_upper(
    mean: np.ndarray, *, alpha: float, gamma: float, sigma2: float, season: int, quantile: float
) -> np.ndarray:
    """ETS(M,N,A)'s upper quantile: each step's error ε is a ratio of its mean μ, and an
    earlier step j's error reaches step h through the level (α μ_j ε_j) and, one season
    later, the season (γ μ_j ε_j): Var ≈ σ² [μ_h² + Σ_{j<h} (α + γ·[m | h−j])² μ_j²] —
    ``_ana_upper``'s sum with each term scaled by its mean, leaving out the σ⁴ terms of
    the exact class-2 variance (Hyndman et al. 2008, ch. 6), about 4 % of σ² at σ = 0.2."""
    upper = np.empty_like(mean)
    z = NormalDist().inv_cdf(quantile)
    for h in range(len(mean)):
        earlier = np.arange(h)  # steps before h (0-based)
        weight = alpha + gamma * ((h - earlier) % season == 0)
        variance = sigma2 * (mean[h] ** 2 + float(np.sum(weight**2 * mean[earlier] ** 2)))
        upper[h] = mean[h] + z * math.sqrt(max(variance, 0.0))
    return upper


def seasonal_naive_forecast(
    series: Sequence[float], steps: int, quantile: float, season: int = SEASON
) -> DemandForecast:
    """Seasonal-naive with an empirical upper quantile: the quantile of the seasonal
    differences seen so far added to the naive value (no model, so no spread otherwise)."""
    mean = seasonal_naive(series, steps, season)
    values = np.asarray(series, dtype=float)
    if len(values) > season:
        errors = values[season:] - values[:-season]
        spread = float(np.quantile(errors, quantile))
        method = Method.seasonal_naive
    else:
        spread = 0.0
        method = Method.seasonal_naive if len(values) == season else Method.latest
    return DemandForecast(
        mean=tuple(mean),
        upper=tuple(m + max(spread, 0.0) for m in mean),
        quantile=quantile,
        method=method,
    )


def initial_states(values: np.ndarray, season: int) -> tuple[float, np.ndarray]:
    """ETS(A,N,A)'s initial level and season by statsmodels' heuristic, over every full
    season of ``values`` (at least two): a centred 2×``season`` moving average is the
    trend, the season the mean detrended value of each phase (centred on 0), the level the
    intercept of a line through the first ten trend values."""
    cycles = len(values) // season
    if season % 2:
        window = np.ones(season)
    else:  # an even season's moving average is a 2×m one, to be centred on a step (FPP 3.3)
        window = np.ones(season + 1)
        window[0] = window[-1] = 0.5
    trend = np.convolve(values[: cycles * season], window / season, mode="valid")
    start = season // 2  # the first value the moving average is centred on
    detrended = np.full(cycles * season, np.nan)
    detrended[start : start + len(trend)] = values[start : start + len(trend)] - trend
    seasonal: np.ndarray = np.nanmean(detrended.reshape(cycles, season), axis=0)
    seasonal -= seasonal.mean()
    steps = np.c_[np.ones(10), np.arange(10) + 1]
    level = float(np.linalg.lstsq(steps, trend[:10], rcond=None)[0][0])
    return level, seasonal


def _ets_model(series: Sequence[float], season: int, *, relative: bool = False) -> ETSModel:
    values = np.asarray(series, dtype=float)
    level, seasonal = initial_states(values, season)
    return ETSModel(
        values,
        error="mul" if relative else "add",
        trend=None,
        seasonal="add",
        seasonal_periods=season,
        initialization_method="known",
        initial_level=level,
        initial_seasonal=seasonal,
    )


@dataclass(frozen=True, slots=True)
class _Fit:
    params: np.ndarray
    relative: bool  # fitted in the multiplicative form: its parameters do not fit the other
    fitted_at: float
    series: tuple[float, ...]
    forecast: DemandForecast


def _relative(series: Sequence[float], error: ErrorForm) -> bool:
    """Whether the multiplicative form applies: to a strictly positive series only."""
    return error is ErrorForm.multiplicative and min(series) > 0


def _ets_forecast(
    series: Sequence[float],
    steps: int,
    quantile: float,
    season: int,
    params: np.ndarray | None,
    relative: bool = False,
) -> tuple[DemandForecast, np.ndarray]:
    model = _ets_model(series, season, relative=relative)
    with warnings.catch_warnings():
        # A flat or perfectly periodic series converges to a bound, and its residuals are
        # all zero (statsmodels then divides 0 by 0 for diagnostics nobody reads here):
        # still the best fit, with a zero-width interval.
        # A series with wild values overflows on the way (the caller checks that what
        # comes out is finite and falls back when it is not).
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        results = model.fit(disp=False) if params is None else model.smooth(params)
        mean = np.asarray(results.forecast(steps), dtype=float)
        upper = (_mna_upper if relative else _ana_upper)(
            mean,
            alpha=float(results.smoothing_level),
            gamma=float(results.smoothing_seasonal),
            sigma2=float(results.mse),  # of the relative errors in the multiplicative form
            season=season,
            quantile=quantile,
        )
    forecast = DemandForecast(
        mean=tuple(float(v) for v in mean),
        upper=tuple(float(v) for v in upper),
        quantile=quantile,
        method=Method.ets,
    )
    return forecast, np.asarray(results.params, dtype=float)


def forecast_demand(
    series: Sequence[float],
    steps: int,
    *,
    quantile: float = DEFAULT_QUANTILE,
    season: int = SEASON,
    error: ErrorForm | None = None,
) -> DemandForecast:
    """``steps`` forecasts after the series' last value: ETS when there are at least two
    seasons of history, else seasonal-naive (see the module docstring). No cache."""
    if not series:
        raise ValueError("an empty series has no forecast")
    if len(series) < MIN_ETS_SEASONS * season:
        return seasonal_naive_forecast(series, steps, quantile, season)
    relative = _relative(series, DEFAULT_ERROR if error is None else error)
    return _ets_forecast(series, steps, quantile, season, None, relative)[0]


class DemandForecaster:
    """``forecast_demand`` with one fit kept per service (see the module docstring).

    Not thread-safe: one per shaping process (or per simulation)."""

    def __init__(
        self, *, refit_s: float = REFIT_S, season: int = SEASON, error: ErrorForm | None = None
    ) -> None:
        self.refit_s = refit_s
        self.season = season
        self.error = DEFAULT_ERROR if error is None else error
        self._fits: dict[str, _Fit] = {}
        # When each service last asked: fits of services not seen for two refit periods
        # (ended, deleted, moved) go, so a long-lived process does not keep every
        # service it ever saw.
        self._used: dict[str, float] = {}
        self._pruned_at: float | None = None
        self.fits = 0  # parameter estimations run (the costly step), for tests and benches

    def forecast(
        self,
        key: str,
        series: Sequence[float],
        steps: int,
        *,
        now: float,
        quantile: float = DEFAULT_QUANTILE,
    ) -> DemandForecast:
        if not series:
            raise ValueError(f"service {key}: an empty series has no forecast")
        if len(series) < MIN_ETS_SEASONS * self.season:
            self._fits.pop(key, None)
            return seasonal_naive_forecast(series, steps, quantile, self.season)
        frozen = tuple(float(v) for v in series)
        cached = self._fits.get(key)
        if (
            cached is not None
            and cached.series == frozen
            and len(cached.forecast.mean) == steps
            and cached.forecast.quantile == quantile
        ):
            return cached.forecast
        self._used[key] = now
        self._prune(now)
        relative = _relative(frozen, self.error)
        stale = (
            cached is None
            or cached.relative != relative  # a zero came into the window or left it
            or now - cached.fitted_at >= self._refit_after(key)
        )
        params = None if stale or cached is None else cached.params
        try:
            forecast, fitted = _ets_forecast(frozen, steps, quantile, self.season, params, relative)
        except (ArithmeticError, ValueError, np.linalg.LinAlgError) as error:
            # One odd series (a spike of 1e300, a degenerate fit) must not stop the cycle
            # that plans every other job: this service falls back, the next cycle tries
            # again.
            logger.warning("service %s: ETS failed (%r); seasonal-naive instead", key, error)
            self._fits.pop(key, None)
            return seasonal_naive_forecast(series, steps, quantile, self.season)
        if not all(math.isfinite(v) for v in (*forecast.mean, *forecast.upper)):
            logger.warning("service %s: ETS gave a non-finite forecast; seasonal-naive", key)
            self._fits.pop(key, None)
            return seasonal_naive_forecast(series, steps, quantile, self.season)
        if stale:
            self.fits += 1
        fitted_at = now if stale or cached is None else cached.fitted_at
        self._fits[key] = _Fit(fitted, relative, fitted_at, frozen, forecast)
        return forecast

    def _refit_after(self, key: str) -> float:
        """``refit_s`` to 1.5 × ``refit_s``, fixed per service: services fitted in the same
        cycle (all of them, after a restart) do not all refit in the same cycle again."""
        return self.refit_s * (1.0 + (zlib.crc32(key.encode()) % 1000) / 2000)

    def _prune(self, now: float) -> None:
        if self._pruned_at is not None and now - self._pruned_at < self.refit_s:
            return
        self._pruned_at = now
        for key, used in list(self._used.items()):
            if now - used > 2 * self.refit_s:
                del self._used[key]
                self._fits.pop(key, None)

    def forget(self, keep: set[str]) -> None:
        """Drop the fits of services no longer seen (ended, deleted)."""
        for key in set(self._fits) - keep:
            del self._fits[key]
