"""The berth blend's exponential-smoothing component and its shrunk weights (issue 16)."""

from __future__ import annotations

import numpy as np
import pytest

from forecasting.core.models import BerthConfig, BerthModel, _smoothing_states
from tests.forecasting.conftest import seasonal_series


def _daily(days: int, level: float = 10.0) -> np.ndarray:
    return np.tile(level + np.sin(2 * np.pi * np.arange(24) / 24), days)


def test_smoothing_on_a_steady_daily_season_forecasts_it_exactly() -> None:
    z = _daily(6)
    level, season, one_step_mae = _smoothing_states(z, alpha=0.5, gamma=0.1)
    assert one_step_mae == pytest.approx(0.0, abs=1e-12)
    origin = len(z)  # forecast the next day from the state after the whole history
    forecast = level[origin] + season[origin, (origin + np.arange(24)) % 24]
    np.testing.assert_allclose(forecast, z[:24], atol=1e-12)


def test_smoothing_follows_a_level_shift_and_skips_unknown_hours() -> None:
    z = np.concatenate([_daily(4), _daily(4, level=20.0)])
    level, _, _ = _smoothing_states(z, alpha=0.9, gamma=0.1)
    assert level[-1] == pytest.approx(20.0, abs=0.5)
    gapped = z.copy()
    gapped[100:110] = np.nan
    level_g, season_g, _ = _smoothing_states(gapped, alpha=0.9, gamma=0.1)
    # over the unknown hours the state does not move
    assert (level_g[100:111] == level_g[100]).all()
    assert (season_g[100:111] == season_g[100]).all()
    assert np.isfinite(level_g).all()


def test_alpha_is_chosen_by_one_step_error_on_the_history() -> None:
    rng = np.random.default_rng(3)
    walk = np.cumsum(rng.normal(0, 1.0, 24 * 10)) + _daily(10)  # persistent level: large gain
    noisy = _daily(10) + rng.normal(0, 1.0, 24 * 10)  # stationary noise: small gain
    model = BerthModel()
    assert model._pick_alpha(walk) == max(model.config.smoothing_alphas)
    assert model._pick_alpha(noisy) == min(model.config.smoothing_alphas)


def test_blend_weights_are_the_mean_of_the_near_best_blends() -> None:
    y = seasonal_series(days=21, trend_per_day=0.5, noise=1.0, seed=2)
    weights = BerthModel(BerthConfig(near_best=0.05, near_best_cv=())).fit(y)._state["weights"]
    best = BerthModel(BerthConfig(near_best=0.0, near_best_cv=())).fit(y)._state["weights"]
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    # the single best blend sits on the 0.1 grid; the mean of the near-best ones need not
    assert np.allclose(best * 10, np.round(best * 10))
    assert (weights >= 0.0).all()
    assert np.abs(weights - best).max() < 0.5  # a neighbourhood of the best, not uniform


def test_a_window_without_error_keeps_the_tie_rule() -> None:
    flat = seasonal_series(days=21) * 0.0 + 8.0  # pinned at a quota: every blend is exact
    weights = BerthModel(BerthConfig(near_best=0.05, near_best_cv=())).fit(flat)._state["weights"]
    assert (weights[:, 3] == 1.0).all()  # ties go to the last value, not to the mean of all


def test_without_the_smoothing_component_it_gets_no_weight() -> None:
    y = seasonal_series(days=21, trend_per_day=0.5, noise=1.0, seed=2)
    weights = BerthModel(BerthConfig(smoothing_component=False)).fit(y)._state["weights"]
    assert (weights[:, 5] == 0.0).all()
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)


def test_the_near_best_share_is_chosen_on_the_fitted_history() -> None:
    y = seasonal_series(days=21, trend_per_day=0.5, noise=1.0, seed=2)
    model = BerthModel().fit(y)
    chosen = model._state["near_best"]
    assert chosen in (0.0, *model.config.near_best_cv)
    # the shipped weights are the ones of the chosen share, fitted on the whole window
    fixed = BerthModel(BerthConfig(near_best=chosen, near_best_cv=())).fit(y)
    np.testing.assert_allclose(model._state["weights"], fixed._state["weights"])
    # refitting the same history chooses the same share: nothing random in the choice
    assert BerthModel().fit(y)._state["near_best"] == chosen
    # without candidates the configured share is used as it is
    assert BerthModel(BerthConfig(near_best=0.05, near_best_cv=())).fit(y)._state["near_best"] == 0.05


def test_an_exact_component_keeps_the_best_blend_alone() -> None:
    # Component 0 is the truth: every share gives the same (zero) error on the newer half,
    # and the tie goes to the best blend alone.
    rng = np.random.default_rng(0)
    target = np.log1p(rng.uniform(5, 50, size=(200, 24)))
    comps = np.stack([target + (0.0 if k == 0 else rng.normal(0, 0.3, target.shape)) for k in range(6)])
    model = BerthModel()
    model._state = {"log": True}
    assert model._pick_near_best(comps, target, [True] * 6) == 0.0
