"""The replay's forecast fits cache (`scheduling.sim.forecast.FitCache`): a re-run of the same
workload reads its fits, and anything a fit depends on changes the file it is kept in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduling.sim import forecast
from scheduling.sim.inventory import parse_cluster_spec
from scheduling.sim.overlays import HOUR_S, InteractiveSession, Overlay


def _overlay(*submits_h: float) -> Overlay:
    sessions = tuple(
        InteractiveSession(
            id=f"int-{i}",
            user="u",
            project="p",
            submit_at=h * HOUR_S,
            duration_s=2 * HOUR_S,
            gpu_count=1 + i % 2,
            requested_s=2 * HOUR_S,
        )
        for i, h in enumerate(submits_h)
    )
    return Overlay(
        sessions=sessions,
        bookings=(),
        preemptible=frozenset(),
        checkpointable=frozenset(),
        checkpoint_interval_s=1_800.0,
    )


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every fit actually computed (a cheap stand-in for the shipped model: the band is the
    history weighted by hour plus the origin, so a wrong cache entry shows)."""
    done: list[tuple[Any, ...]] = []

    def fake_fit(job: tuple[np.ndarray, int, str, int, float]) -> tuple[tuple[float, ...], float]:
        history, origin_h, _model, horizon_h, _phase = job
        done.append(job)
        level = float(np.dot(history, np.arange(1, len(history) + 1)))  # depends on when, too
        return tuple(level + origin_h + k for k in range(horizon_h)), 0.0

    monkeypatch.setattr(forecast, "_fit_one", fake_fit)
    return done


def test_a_rerun_reads_every_fit_from_the_cache(tmp_path: Path, fits: list[tuple[Any, ...]]) -> None:
    overlay = _overlay(*range(0, 24 * 5, 7))
    inventory = parse_cluster_spec("8x1")
    kwargs: dict[str, Any] = {"end_at": 5 * 24 * HOUR_S, "workers": 1}
    cold = forecast.fit_session_forecast(overlay, inventory, cache_dir=tmp_path, **kwargs)
    assert cold.fits == 5
    assert cold.cached == 0
    assert len(fits) == 5
    warm = forecast.fit_session_forecast(overlay, inventory, cache_dir=tmp_path, **kwargs)
    assert warm.cached == 5
    assert len(fits) == 5
    assert warm.uppers == cold.uppers
    assert warm.origins_h == cold.origins_h
    assert warm.report()["cached_fits"] == 5
    uncached = forecast.fit_session_forecast(overlay, inventory, **kwargs)
    assert uncached.uppers == cold.uppers
    assert uncached.cached == 0
    assert len(fits) == 10


def test_other_inputs_miss_the_cache(tmp_path: Path, fits: list[tuple[Any, ...]]) -> None:
    inventory = parse_cluster_spec("8x1")
    kwargs: dict[str, Any] = {"end_at": 3 * 24 * HOUR_S, "workers": 1, "cache_dir": tmp_path}
    first = forecast.fit_session_forecast(_overlay(1, 30), inventory, **kwargs)
    # the same first day, then other demand: the first origin's fit is shared, the second not
    other = forecast.fit_session_forecast(_overlay(1, 31), inventory, **kwargs)
    assert other.cached == 1
    assert other.uppers[0] == first.uppers[0]
    assert other.uppers[1] != first.uppers[1]
    shifted = forecast.fit_session_forecast(_overlay(1, 30), inventory, week_phase_s=3_600.0, **kwargs)
    assert shifted.cached == 0
    assert len(fits) == 3 + 2 + 3  # origins at 24, 48 and 72 h


def test_an_unreadable_entry_is_fitted_again(tmp_path: Path, fits: list[tuple[Any, ...]]) -> None:
    inventory = parse_cluster_spec("8x1")
    kwargs: dict[str, Any] = {"end_at": 2 * 24 * HOUR_S, "workers": 1, "cache_dir": tmp_path}
    first = forecast.fit_session_forecast(_overlay(1, 5), inventory, **kwargs)
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == first.fits == 2  # origins at 24 and 48 h
    entries[0].write_text("{not json", encoding="utf-8")
    again = forecast.fit_session_forecast(_overlay(1, 5), inventory, **kwargs)
    assert again.cached == 1
    assert again.uppers == first.uppers
    assert len(fits) == 3
