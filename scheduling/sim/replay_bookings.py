"""The replay's booking desk: bookings as the portal admits, seats and releases them.

`Replay` (``scheduling.sim.replay``) mixes this in: a booking is created with the GPUs
`booking_create` would pick (`BookingDesk._admission_gpus`), its owner is seated when the GPUs
are free (honored when within ``HONORED_WITHIN_S`` of arriving), a no-show is released after the
overlay's grace, and the rest of a window the owner leaves early is given back.  Also the
replay's event kinds, shared by both modules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduling import admission
from scheduling.engine.preemption import is_consenting
from scheduling.engine.types import Booking, JobKind, Plan, PolicyConfig, RunningJob
from scheduling.sim.metrics import BookingOutcome, ReplayRecord
from scheduling.sim.overlays import BookingPlan, Overlay

if TYPE_CHECKING:
    from scheduling.backends.simulator import SimulatorBackend
    from scheduling.sim.inventory import Inventory
    from scheduling.sim.replay_setup import ReplayOptions

# Event kinds, in processing order within one instant.
(
    _ARRIVE,
    _SESSION,
    _BK_CREATE,
    _BK_WAKE,
    _BK_OWNER_IN,
    _BK_OWNER_OUT,
    _BK_END,
    _BK_NO_SHOW,
    _ABANDON,
    _WAKE,
    _TICK,
) = range(11)
_KIND_NAMES = (
    "arrival",
    "session",
    "booking",
    "booking",
    "booking",
    "booking",
    "booking",
    "booking",
    "abandon",
    "engine_wake",
    "tick",
)
# the portal extends a running job's allocation this far ahead before it lapses
# (`rounds._EXTEND_BY`), so an overrunning job blocks bookings only that long
_EXTEND_S = 1_800.0
HONORED_WITHIN_S = 60.0  # a booking owner served within this of arriving is honored


# Which running jobs block a booking's pick (`BookingDesk._admission_gpus`).
def _any_running(running: RunningJob) -> bool:
    return True


def _unreclaimable(running: RunningJob) -> bool:
    return running.job.kind != JobKind.BATCH or not is_consenting(running)


def _no_running(running: RunningJob) -> bool:
    return False


@dataclass(slots=True)
class _BookingState:
    plan: BookingPlan
    gpu_ids: tuple[int, ...]  # the portal's assignment until fixed, then the final GPUs
    booking: Booking
    is_fixed: bool = False
    engine_gpu_ids: tuple[int, ...] = ()
    owner_arrived_at: float | None = None
    holding_since: float | None = None
    is_closed: bool = False


class BookingDesk:
    """The booking half of `Replay` (see the module docstring); the attributes are `Replay`'s."""

    inventory: Inventory
    overlay: Overlay
    config: PolicyConfig
    options: ReplayOptions
    backend: SimulatorBackend
    record: ReplayRecord
    _bookings: dict[str, _BookingState]
    _booked_windows: dict[int, list[tuple[float, float]]]
    _alloc_end: dict[str, float]
    _running: dict[str, RunningJob]
    _waiting_owners: list[str]
    _released_no_show: int

    def _push(self, at: float, kind: int, index: int) -> None:
        raise NotImplementedError  # `Replay._push`

    def _add_segment(self, kind: str, start: float, useful_end: float, gpus: int) -> None:
        raise NotImplementedError  # `Replay._add_segment`

    def _create_booking(self, plan: BookingPlan, t: float) -> None:
        """The booking as the portal admitted it (`scheduling.sim.overlays`: the portal's rules)."""
        chosen = plan.gpu_ids
        if self.options.booking_gpus == "portal" and chosen:
            # under static, bookings go to its interactive partition (the engine's rule, and the
            # partition is sized for their demand); only one the partition cannot hold goes
            # elsewhere (the replay keeps every booking the overlay admitted)
            partition = frozenset(self.config.interactive_partition)
            in_partition = self._admission_choice(plan, t, nodes=partition) if partition else None
            chosen = in_partition or self._admission_choice(plan, t) or chosen
        for gpu in chosen:
            self._booked_windows.setdefault(gpu, []).append((plan.start_at, plan.end_at))
        booking = Booking(
            id=plan.id,
            user=plan.user,
            project=plan.project,
            gpu_count=plan.gpu_count,
            start_at=plan.start_at,
            end_at=plan.end_at,
            gpu_type=plan.gpu_type,
            gpu_ids=tuple(sorted(chosen)) if self.options.booking_gpus == "portal" else (),
        )
        state = _BookingState(plan, tuple(sorted(chosen)), booking, is_fixed=bool(booking.gpu_ids))
        self._bookings[plan.id] = state
        index = int(plan.id.split("-")[1])
        lead = self.config.booking_lead_s + self.config.grace_s
        if plan.start_at - lead > t:
            self._push(plan.start_at - lead, _BK_WAKE, index)
        self._push(plan.start_at, _BK_WAKE, index)
        grace = self.overlay.config.booking_grace_s
        if plan.use_start_at is not None and plan.use_end_at is not None:
            self._push(plan.use_start_at, _BK_OWNER_IN, index)
            self._push(plan.use_end_at, _BK_OWNER_OUT, index)
        if grace > 0 and plan.start_at + grace < plan.end_at:
            self._push(plan.start_at + grace, _BK_NO_SHOW, index)
        self._push(plan.end_at, _BK_END, index)

    def _admission_choice(
        self, plan: BookingPlan, t: float, *, nodes: frozenset[str] = frozenset()
    ) -> tuple[int, ...] | None:
        """`_admission_gpus` with what blocks relaxed in turn (see there), on ``nodes`` if given."""
        return (
            self._admission_gpus(plan, t, nodes=nodes)
            or self._admission_gpus(plan, t, counts_running=_unreclaimable, nodes=nodes)
            or self._admission_gpus(plan, t, counts_running=_no_running, nodes=nodes)
        )

    def _admission_gpus(
        self,
        plan: BookingPlan,
        t: float,
        *,
        counts_running: Callable[[RunningJob], bool] = _any_running,
        nodes: frozenset[str] = frozenset(),
    ) -> tuple[int, ...] | None:
        """The GPUs `booking_create` picks at ``t``: of the booking's type, with no blocking
        allocation overlapping its window (other bookings, and running jobs until their
        allocation's end: the start's expected end, or about ``_EXTEND_S`` ahead while the job
        overruns it, as `rounds._extend_running` keeps it); None when none fit.

        The overlay's admission counted capacity minus overlapping bookings and admitted the
        booking, so the replay keeps it (it cannot know whether the portal would have refused
        it) and picks again with only the running work ``counts_running`` says blocks:

        * first ``_unreclaimable``: work a booking cannot take back (sessions, batch work
          without consent), so the running work in the way is reclaimed a grace before the
          start (`Reclaim.for_bookings`, under policies with a reclaim stage) or ends.
          Without this step an 8-GPU booking went on a running session's GPUs, and its owner
          waited 2 h for them (KTH overlay, seed 1, berth: the year's one unhonored booking);
        * then ``_no_running``: only other bookings block, so two bookings never share a GPU
          (the database's exclusion constraint).  The overlay's own pick, made without the
          replay's picks of earlier bookings, could share one (seed 1 of the KTH overlay: one
          owner waited 86 s for a GPU another booking held)."""
        start, end = plan.start_at, plan.end_at
        busy_until: dict[int, float] = {}
        for job_id, running in self._running.items():
            if not counts_running(running):
                continue
            alloc_end = max(self._alloc_end.get(job_id, math.inf), t + _EXTEND_S)
            for gpu in running.gpu_ids:
                busy_until[gpu] = alloc_end
        free: list[admission.FreeNode] = []
        for index, node in enumerate(self.inventory.nodes):
            if plan.gpu_type is not None and node.gpu_type != plan.gpu_type:
                continue
            if nodes and node.id not in nodes:
                continue
            ids = []
            for gpu in node.gpu_ids:
                if busy_until.get(gpu, -math.inf) > start:
                    continue
                windows = self._booked_windows.get(gpu)
                if windows:
                    windows[:] = [w for w in windows if w[1] > t]
                    if any(w_start < end and start < w_end for w_start, w_end in windows):
                        continue
                ids.append(gpu)
            if ids:
                free.append(admission.FreeNode(index, node.id, 0, tuple(ids)))
        pick = admission.pick_gpus(free, gpu_count=plan.gpu_count)
        return tuple(sorted(pick[0])) if pick is not None else None

    def _booking_event(self, kind: int, plan: BookingPlan, t: float) -> None:
        state = self._bookings.get(plan.id)
        if state is None or state.is_closed:
            return
        if kind == _BK_NO_SHOW:
            if state.owner_arrived_at is None:
                # Nobody came within the grace: the portal releases the booking.
                self._released_no_show += 1
                self._close_booking(state, t, is_no_show=True)
        elif kind == _BK_OWNER_IN:
            state.owner_arrived_at = t
            state.booking = dataclasses.replace(state.booking, is_in_use=True)
            self._waiting_owners.append(plan.id)
        elif kind in (_BK_OWNER_OUT, _BK_END):
            self._close_booking(state, t)

    def _seat_owners(self, t: float) -> bool:
        """Give waiting booking owners their GPUs where free; True if anyone was seated."""
        still: list[str] = []
        for booking_id in self._waiting_owners:
            state = self._bookings.get(booking_id)
            if state is None or state.is_closed:
                continue
            if not state.is_fixed:
                still.append(booking_id)  # its GPUs are fixed by the round at its start
                continue
            if self.backend.hold(booking_id, state.gpu_ids):
                state.holding_since = t
                assert state.owner_arrived_at is not None
                wait = t - state.owner_arrived_at
                self.record.bookings.append(
                    BookingOutcome(booking_id, is_honored=wait <= HONORED_WITHIN_S + 1e-6, owner_wait_s=wait)
                )
            else:
                still.append(booking_id)
        seated = len(still) != len(self._waiting_owners)
        self._waiting_owners = still
        return seated

    def _close_booking(self, state: _BookingState, t: float, *, is_no_show: bool = False) -> None:
        state.is_closed = True
        booking_id = state.plan.id
        if state.holding_since is not None:
            self.backend.unhold(booking_id)
            self._add_segment("booking", state.holding_since, t, len(state.gpu_ids))
        elif state.owner_arrived_at is not None:
            # The owner came and never got the GPUs.
            self.record.bookings.append(
                BookingOutcome(booking_id, is_honored=False, owner_wait_s=t - state.owner_arrived_at)
            )
        elif state.plan.use_start_at is None or is_no_show:
            self.record.bookings.append(BookingOutcome(booking_id, is_honored=None))
        # The rest of the window is given back: the portal shortens the booking.
        window = (state.plan.start_at, state.plan.end_at)
        for gpu in state.gpu_ids:
            windows = self._booked_windows.get(gpu)
            if windows and window in windows:
                windows.remove(window)
        del self._bookings[booking_id]

    def _fix_bookings(self, plan: Plan, t: float) -> None:
        """Track the engine's GPU choice for bookings; fix it once a booking has started."""
        for reservation in plan.reservations:
            state = self._bookings.get(reservation.holder_id)
            if state is not None and not state.is_fixed and len(reservation.gpu_ids) == state.plan.gpu_count:
                state.engine_gpu_ids = tuple(sorted(reservation.gpu_ids))
        for state in self._bookings.values():
            if not state.is_fixed and state.plan.start_at <= t:
                state.gpu_ids = state.engine_gpu_ids or state.gpu_ids
                state.booking = dataclasses.replace(state.booking, gpu_ids=state.gpu_ids)
                state.is_fixed = True
