"""The one percentile and Jain's index (scheduling.stats): each method against numpy's own.

Pure: no database.  numpy is the oracle here (``numpy.quantile`` with the same method name);
the module itself does not use it (sorting a short list is faster than a round trip through
numpy, and the replay calls it per job)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.stats import jain_index, percentile, quantile

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
values_st = st.lists(finite, min_size=1, max_size=300)
METHODS = ("inverted_cdf", "nearest", "linear")


@pytest.mark.parametrize("method", METHODS)
@given(values=values_st, q=st.floats(min_value=0.0, max_value=1.0))
def test_quantile_is_numpys(method: str, values: list[float], q: float) -> None:
    expected = float(np.quantile(values, q, method=method))  # type: ignore[call-overload]
    got = quantile(values, q, method=method)  # type: ignore[arg-type]
    if method == "linear":  # numpy interpolates from the nearer end: the last bits may differ
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-6)
    else:  # a picked value, never a computed one: exactly numpy's
        assert got == expected


@pytest.mark.parametrize("method", METHODS)
@given(values=values_st, p=st.floats(min_value=0.0, max_value=100.0))
def test_percentile_is_the_quantile_at_p_over_100(method: str, values: list[float], p: float) -> None:
    assert percentile(values, p, method=method) == quantile(values, p / 100, method=method)  # type: ignore[arg-type]


def test_the_methods_on_a_small_list() -> None:
    values = [5.0, 1.0, 3.0, 4.0]  # sorted: 1 3 4 5
    assert percentile(values, 50) == 3.0  # nearest rank: ceil(0.5 * 4) = 2nd
    assert percentile(values, 50, method="nearest") == 4.0  # index round(1.5) = 2 (ties to even)
    assert percentile(values, 50, method="linear") == 3.5
    assert percentile(list(map(float, range(100))), 99) == 98.0
    assert percentile(list(map(float, range(100))), 99, method="nearest") == 98.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0


@pytest.mark.parametrize("method", METHODS)
def test_no_values_is_zero(method: str) -> None:
    assert quantile([], 0.95, method=method) == 0.0  # type: ignore[arg-type]


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)  # one takes all: 1/n
    assert jain_index([1.0, 2.5]) == pytest.approx(3.5**2 / (2 * (1.0 + 6.25)))
    assert jain_index([]) == 1.0
    assert jain_index([0.0, 0.0]) == 1.0


@given(st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=1, max_size=50))
def test_jain_index_lies_between_one_over_n_and_one(values: list[float]) -> None:
    assert 1 / len(values) - 1e-9 <= jain_index(values) <= 1 + 1e-9
