"""`booking_alternatives(limit=...)` answers at most ``limit`` windows.

The function reused the name ``limit`` for the number of calendar rows to read (400 and then
the rest up to `BERTH_ALTERNATIVES_MAX_ROWS`), so the answer was cut at that count, not at the
caller's: with more GPU types than ``limit`` every type was offered.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduling import selectors
from tests.factories import GpuTypeFactory, NodeFactory

pytestmark = pytest.mark.django_db


def test_alternatives_stop_at_the_limit(a100, cluster, nodes, soon):
    hour = timedelta(hours=1)
    for i in range(3):  # three more types with enough memory, each on a node of its own
        other = GpuTypeFactory(name=f"H{i}", memory_gib=96.0, precisions=list(a100.precisions))
        NodeFactory(cluster=cluster, gpu_type=other, name=f"h{i}", gpu_count=4)
    every = selectors.booking_alternatives(
        gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + hour, limit=10
    )
    assert len(every) == 4  # A100 and the three others: all free now
    assert every[0].gpu_type == "A100"
    for limit in (1, 2, 3):
        some = selectors.booking_alternatives(
            gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + hour, limit=limit
        )
        assert some == every[:limit]
