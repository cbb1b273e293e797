"""Order statistics and Jain's fairness index: the one definition every caller uses.

Pure Python (no Django, no numpy): the replay, the benchmarks and the ops pages call these on
lists of a few to a few thousand values, where sorting a list is some 30 times faster than a
round trip through numpy.  The methods are numpy's (``numpy.quantile(..., method=...)``) and
``tests/scheduling/test_stats.py`` checks every one against numpy:

* ``inverted_cdf``: the nearest-rank quantile, ``sorted(values)[ceil(q * n) - 1]``; the replay
  metrics of DESIGN §8 (``wait_p95_s``, ``interactive_wait_p95_s``, ``round_ms_p99``) and
  ``bench.engine_scale`` use it.
* ``nearest``: the value at the nearest index, ``sorted(values)[round(q * (n - 1))]`` (ties to
  the even index); ``bench.round``, ``bench.api``, the calendar benchmark and the replay's
  simple history predictor use it.
* ``linear``: interpolated between the two nearest indexes; the ops pages' wait percentiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

Method = Literal["inverted_cdf", "nearest", "linear"]


def quantile(values: Sequence[float], q: float, *, method: Method = "inverted_cdf") -> float:
    """The ``q`` quantile (``q`` in [0, 1]) of ``values`` by ``method``; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    n = len(ordered)
    if method == "inverted_cdf":
        return float(ordered[max(1, math.ceil(q * n)) - 1])
    if method == "nearest":
        return float(ordered[min(n - 1, max(0, round(q * (n - 1))))])
    k = (n - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


def percentile(values: Sequence[float], p: float, *, method: Method = "inverted_cdf") -> float:
    """The ``p`` percentile (``p`` in [0, 100]): `quantile` at ``p / 100``; 0.0 for no values."""
    return quantile(values, p / 100, method=method)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 = all equal, 1/n = one takes all.

    1.0 for no values or all zeros (nobody is favoured over anybody); a caller that wants to
    show "nothing to judge" instead tests for that before calling.
    """
    if not values:
        return 1.0
    square_sum = sum(v * v for v in values)
    if square_sum == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square_sum)
