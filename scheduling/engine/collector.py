"""Python's cyclic garbage collector paused for the length of one round.

A round allocates tens of thousands of container objects (sort keys, placements, one
explanation per waiting job) that die by reference counting or live on in the plan; none of
them form cycles worth collecting mid-round.  With the collector running, each 700 of them
start a young collection, and the survivors soon trigger full collections over the whole heap
(the snapshot included): on `bench.engine_scale` 1000x8 / 10,000 pending that was 10-35 ms of a
berth round, the most in the rounds that hit a full collection (docs/benchmarks.md,
"Speed III").  Paused, the collector looks at the round's survivors once, at its next run after
the round.  Plans do not depend on it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block, re-enable it after (if it was enabled:
    an outer pause, or a caller that runs without it, is left alone)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
