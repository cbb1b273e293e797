"""The replay's tick rule: when waiting alone could let a round start something.

`Replay` (``scheduling.sim.replay``) mixes this in.  Between events the replay runs a round
every ``tick_s`` (doubling up to ``max_tick_s`` while ticks start nothing), but only while a
round could act on time passing: GPUs are free and some pending batch job may use enough of
them, or an interactive session waits (with GPUs free or, under a policy that reclaims, with
running work that may pass its minimum runtime).  A round that cannot act changes nothing, so
not running it changes no schedule of a policy that only starts work on free GPUs.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scheduling.sim.replay_bookings import _TICK

if TYPE_CHECKING:
    from scheduling.backends.simulator import SimulatorBackend
    from scheduling.engine.types import JobRequest
    from scheduling.sim.replay_setup import ReplayOptions


class TickRule:
    """The tick half of `Replay` (see the module docstring); the attributes are `Replay`'s."""

    options: ReplayOptions
    backend: SimulatorBackend
    _partition_gpus: set[int]
    _batch_capacity: int
    _batch_widths: Counter[int]
    _interactive_gpus: int
    _reclaims: bool
    _strict_order: bool
    _pending: dict[str, JobRequest]
    _tick_gen: int
    _tick_interval: float

    def _push(self, at: float, kind: int, index: int) -> None:
        raise NotImplementedError  # `Replay._push`

    def _free_split(self) -> tuple[int, int]:
        """(free GPUs, of them outside the interactive partition); both equal without one."""
        free = self.backend.free_gpu_count
        if not self._partition_gpus or free == 0:
            return free, free
        is_free = self.backend.is_free
        return free, free - sum(1 for g in self._partition_gpus if is_free(g))

    def _batch_could_start(self, free: int, batch_free: int) -> bool:
        """Whether some pending batch job is no wider than the free GPUs it may use: those
        outside the interactive partition, or all of them for a job wider than that side
        (static runs such a job across the partition).  By width (a few sizes), not by job:
        the queue can be thousands long every round."""
        capacity = self._batch_capacity
        return any(
            width <= (batch_free if width <= capacity else free)
            for width, count in self._batch_widths.items()
            if count > 0
        )

    def _batch_side_full(self) -> bool:
        """Whether no GPU batch work may use is free: none at all, or (static) none outside
        the partition while no job wider than that side waits (such a job's reservation could
        hold the partition's GPUs)."""
        free, batch_free = self._free_split()
        if batch_free > 0:
            return False
        if free == 0:
            return True
        capacity = self._batch_capacity
        return not any(count > 0 for width, count in self._batch_widths.items() if width > capacity)

    def _could_use_time(self) -> bool:
        """Whether waiting alone might let a round start something: GPUs are free and some
        pending batch job may use enough of them, or an interactive session waits and GPUs are
        free or, under a policy that reclaims, running work may be taken back for it once it
        passes its minimum runtime (no GPU need be free for that)."""
        free, batch_free = self._free_split()
        if self._interactive_gpus and (free or self._reclaims):
            return True
        if free == 0 or self._strict_order:
            # strict order (fifo): the round after the last event started every job up to the
            # first that did not fit; with nothing freed, nothing arrived and the order fixed,
            # that job still does not fit (a booking's window only comes nearer) and nobody
            # passes it, so a round on time alone starts no batch work
            return False
        return self._batch_could_start(free, batch_free)

    def _schedule_tick(self, t: float, *, after_tick: bool, acted: bool) -> None:
        self._tick_gen += 1
        if self.options.tick_s <= 0 or not self._pending or not self._could_use_time():
            self._tick_interval = self.options.tick_s
            return
        if after_tick and not acted:
            self._tick_interval = min(self._tick_interval * 2, self.options.max_tick_s)
        else:
            self._tick_interval = self.options.tick_s
        self._push(t + self._tick_interval, _TICK, self._tick_gen)
