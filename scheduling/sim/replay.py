"""The replay driver: a trace plus overlays, through `plan_round`, on the simulator backend.

The driver plays the portal's part (queue, bookings, predictions, policy set-up) and the
simulator backend plays the cluster's.  The policy inputs come from the portal's own code:
decayed project usage and quotas through `scheduling.inputs` (the functions
`scheduling.snapshots` calls), runtime predictions from the predictor passed in (the benchmark
passes the portal's `forecasting.core.runtime.HistoryRuntimePredictor`), and berth's
interactive headroom and pool from the portal's forecaster fitted on the replay's own past
session demand (`scheduling.sim.forecast`).

Sessions give up after the overlay's patience (``sessions_abandoned``); a booking whose owner has
not come within the overlay's grace after its start is released; a booking is honored when its
owner had all booked GPUs within 60 s of arriving (a fixed threshold, not the policy's grace).

Time advances from event to event: arrivals, completions, preemption kills, booking creation /
start / owner arrival / owner leaving / end, and a tick while a GPU is free and a session waits
or a pending job is no wider than the free GPUs (30 s, doubling up to ``max_tick_s`` while
rounds change nothing, reset by any other event).  `plan_round` runs after every event batch
except batch arrivals while no GPU is free (nothing could start, and batch arrivals cannot
trigger a preemption: the replay configures no guaranteed quotas), the patience check of a
session that already started (it changes nothing) and, under easy, static and berth, a tick that would
plan what the last round did (`scheduling.sim.replay_still`).  Claims: `scheduling.sim.claims`.
Bookings (admission, seating owners, no-shows): `scheduling.sim.replay_bookings`; options,
per-policy set-up and arguments: `scheduling.sim.replay_setup` (re-exported).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Unpack

from scheduling import inputs
from scheduling.backends.simulator import SimulatorBackend, TransitionKind
from scheduling.engine.types import (
    ClusterSnapshot,
    IdleReason,
    JobKind,
    JobRequest,
    Plan,
    RunningJob,
)
from scheduling.sim import bounds
from scheduling.sim.claims import ClaimBook
from scheduling.sim.inventory import Inventory
from scheduling.sim.metrics import UNEXPLAINED, JobOutcome, ReplayRecord
from scheduling.sim.overlays import Overlay
from scheduling.sim.replay_bookings import (
    _ABANDON,
    _ARRIVE,
    _BK_CREATE,
    _BK_END,
    _BK_NO_SHOW,
    _BK_OWNER_IN,
    _BK_OWNER_OUT,
    _BK_WAKE,
    _KIND_NAMES,
    _SESSION,
    _TICK,
    _WAKE,
    HONORED_WITHIN_S,
    BookingDesk,
    _BookingState,
)
from scheduling.sim.replay_setup import (
    _SETUP_KEYS,
    POLICIES,
    PlanFn,
    ReplayOptions,
    ReplaySetup,
    policy_config,
)
from scheduling.sim.replay_still import StillTickRule, still_plan_difference
from scheduling.sim.replay_ticks import TickRule
from scheduling.sim.trace import Trace

__all__ = [
    "HONORED_WITHIN_S",
    "POLICIES",
    "PlanFn",
    "Replay",
    "ReplayOptions",
    "ReplaySetup",
    "policy_config",
    "run_replay",
]


_REASON_VALUE = {reason: reason.value for reason in IdleReason}  # cheaper than the enum's .value


@dataclass(slots=True)
class _Meta:
    request: JobRequest
    runtime_s: float  # true total work
    kind: JobKind
    fits: bool  # some empty-cluster placement exists
    started_at: float | None = None  # first start


class Replay(BookingDesk, TickRule, StillTickRule):
    """One policy over one workload.  Use `run_replay` unless you need the internals."""

    def __init__(
        self, trace: Trace, inventory: Inventory, overlay: Overlay, **setup: Unpack[ReplaySetup]
    ) -> None:
        unknown = set(setup) - _SETUP_KEYS
        if unknown:
            raise TypeError(f"unexpected replay arguments: {', '.join(sorted(unknown))}")
        policy = setup["policy"]
        self.trace = trace
        self.inventory = inventory
        self.overlay = overlay
        self.policy = policy
        self.plan_fn = setup["plan_fn"]
        self.options = setup.get("options") or ReplayOptions()
        predictor = setup.get("predictor")
        self.predictor = predictor if policy in self.options.predict_for else None
        self.config = setup.get("config") or policy_config(
            policy, inventory=inventory, overlay=overlay, options=self.options, seed=setup.get("seed", 0)
        )
        self.backend = SimulatorBackend(inventory.nodes, strict=self.options.strict)
        self.record = ReplayRecord(capacity_gpus=inventory.capacity_gpus)
        self._capacity_by_type = Counter[str]()
        for node in inventory.nodes:
            self._capacity_by_type[node.gpu_type] += len(node.gpu_ids)
        self._partition_gpus = {
            g
            for node in inventory.nodes
            if node.id in self.config.interactive_partition
            for g in node.gpu_ids
        }
        # GPUs batch work may use without spanning the partition (static: the other nodes)
        self._batch_capacity = inventory.capacity_gpus - len(self._partition_gpus)
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._pending: dict[str, JobRequest] = {}
        self._claims = ClaimBook()  # for whom work was reclaimed (`ClusterSnapshot.claims`)
        self._running: dict[str, RunningJob] = {}
        # job id -> (project, GPUs x value, started_at) of running work, for the usage ledger
        self._running_usage: dict[str, tuple[str, float, float]] = {}
        self._meta: dict[str, _Meta] = {}
        self._feasible_pending = 0
        self._pending_widths: Counter[int] = Counter()  # GPUs -> pending jobs of that size
        self._batch_widths: Counter[int] = Counter()  # the same for the pending batch jobs
        self._interactive_gpus = 0  # GPUs of the on-demand sessions waiting
        self._bookings: dict[str, _BookingState] = {}
        # the portal's booking admission state: booked windows per GPU, and when each running
        # job's allocation ends (the start's expected end, extended while it overruns)
        self._booked_windows: dict[int, list[tuple[float, float]]] = {}
        self._alloc_end: dict[str, float] = {}
        self._waiting_owners: list[str] = []
        self._tick_gen = 0
        self._tick_interval = self.options.tick_s
        self._idle_counts: Counter[str] = Counter()
        self._last_t = 0.0
        self._idle_tick_rounds = 0
        self._forecast = setup.get("forecast") if policy == "berth" else None
        # berth's round takes consenting work back for sessions (its reclaim stage)
        self._reclaims = policy == "berth"
        # fifo starts nothing behind a blocked head, so time alone never lets it start batch work
        self._strict_order = policy == "fifo"
        self._oracle = bool(setup.get("oracle", False))
        self._usage = inputs.UsageLedger(half_life_s=self.config.fairshare_half_life_s)
        self._gpu_value = {t.name: t.value for t in inventory.gpu_types}
        self._gpu_type_of = {g: node.gpu_type for node in inventory.nodes for g in node.gpu_ids}
        self._specs = [
            inputs.ProjectSpec(name=p.name, weight=p.weight, guaranteed=p.guaranteed)
            for p in overlay.projects
        ]
        self._shares = inputs.ShareBuilder(self._specs)
        self._abandoned = 0
        self._abandoned_gpu_s = 0.0  # session GPU-time never served because its user gave up
        self._sessions_total = len(overlay.sessions)
        self._released_no_show = 0
        self._wakes: set[float] = set()
        self._triggers: Counter[str] = Counter()  # what caused each round
        self._init_still(policy, self.plan_fn, enabled=self.options.skip_still_ticks)

    # ---- events ----

    def _push(self, at: float, kind: int, index: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, kind, self._seq, index))

    def _seed_events(self) -> None:
        events: list[tuple[float, int, int, int]] = []
        for index, job in enumerate(self.trace.jobs):
            events.append((job.submit_at, _ARRIVE, index, index))
        offset = len(events)
        for index, session in enumerate(self.overlay.sessions):
            events.append((session.submit_at, _SESSION, offset + index, index))
        offset = len(events)
        for index, booking in enumerate(self.overlay.bookings):
            events.append((booking.created_at, _BK_CREATE, offset + index, index))
        heapq.heapify(events)
        self._events = events
        self._seq = len(events)

    # ---- main loop ----

    def run(self) -> ReplayRecord:
        """Replay everything; returns the record (metrics come from `compute_metrics`)."""
        wall_start = time.perf_counter()
        self._seed_events()
        backend = self.backend
        while True:
            t_driver = self._events[0][0] if self._events else math.inf
            t_backend = backend.next_event_at()
            t = min(t_driver, t_backend if t_backend is not None else math.inf)
            if t == math.inf or t > self.options.stop_at_s:
                break
            self._accrue(t)
            freed = self._handle_transitions(t)
            kinds: set[int] = set()
            while self._events and self._events[0][0] <= t:
                _, kind, _, index = heapq.heappop(self._events)
                if kind == _TICK and index != self._tick_gen:
                    continue  # superseded tick
                if self._handle_event(kind, index, t):
                    kinds.add(kind)
            seated = self._seat_owners(t) if self._waiting_owners else False
            if not (freed or kinds or seated):
                continue
            is_tick = kinds == {_TICK} and not freed and not seated
            is_idle = kinds <= {_TICK, _WAKE} and not freed and not seated
            if is_idle and backend.next_event_at() is None and self._only_ticks_left():
                self._idle_tick_rounds += 1
                if self._idle_tick_rounds > self.options.max_idle_rounds:
                    break  # only jobs that can never start are left
            if kinds == {_ARRIVE} and not freed and not seated and self._batch_side_full():
                self._still = None  # the queue changed without a round
                continue  # nothing can start and a batch arrival preempts nothing
            if not is_tick:
                self._still = None  # something happened: a tick is still only after a round
            trigger = (
                "completion" if freed else ("tick" if is_tick else _KIND_NAMES[min(kinds or {_BK_WAKE})])
            )
            self._triggers[trigger] += 1
            acted = self._round(t, is_tick=is_tick)
            if acted:
                self._idle_tick_rounds = 0
            self._schedule_tick(t, after_tick=is_tick, acted=acted)
        self._finish(wall_start)
        return self.record

    def _only_ticks_left(self) -> bool:
        return all(kind in (_TICK, _WAKE) for _, kind, _, _ in self._events)

    def _accrue(self, t: float) -> None:
        dt = t - self._last_t
        if dt > 0:
            if self._feasible_pending:
                self.record.add_queue_window(self._last_t, t)
                self.record.ceiling_gpu_s += self._ceiling_gpus() * dt
            for reason, count in self._idle_counts.items():
                self.record.idle_gpu_s[reason] = self.record.idle_gpu_s.get(reason, 0.0) + count * dt
        self._last_t = t

    def _ceiling_gpus(self) -> int:
        """GPUs that could be busy right now: those in use plus the best fill of the free GPUs
        with pending jobs (``bounds.instant_fill``); the per-instant term of
        ``busy_util_ceiling``."""
        free = self.backend.free_gpu_count
        capacity = self.record.capacity_gpus
        if free <= 0:
            return capacity
        return capacity - free + bounds.instant_fill(free, self._pending_widths)

    # ---- jobs ----

    def _fits(self, gpu_count: int, gpu_type: str | None) -> bool:
        if gpu_type is None:
            return gpu_count <= self.record.capacity_gpus
        return gpu_count <= self._capacity_by_type.get(gpu_type, 0)

    def _enqueue(self, request: JobRequest, meta: _Meta, *, saved_s: float = 0.0) -> None:
        """Queue ``request``; a batch job is predicted once, at its submission.  A requeued job
        keeps the prediction it ran with, less the progress its checkpoint saved (``saved_s``):
        the portal does the same (`inputs.resumed_prediction`)."""
        if self.predictor is not None and request.kind == JobKind.BATCH:
            p50, p90 = request.predicted_p50_s, request.predicted_p90_s
            if p50 is None or p90 is None:
                p50, p90 = self.predictor.predict(request)
            else:
                p50, p90 = inputs.resumed_prediction(p50, p90, saved_s=saved_s)
            request = dataclasses.replace(request, predicted_p50_s=p50, predicted_p90_s=p90)
        self._pending[request.id] = request
        self._pending_widths[request.gpu_count] += 1
        if request.kind == JobKind.BATCH:
            self._batch_widths[request.gpu_count] += 1
        if meta.fits:
            self._feasible_pending += 1
        if request.kind == JobKind.INTERACTIVE:
            self._interactive_gpus += request.gpu_count

    def _handle_event(self, kind: int, index: int, t: float) -> bool:
        """Apply one driver event; False when it changed nothing (an abandon check of a session
        that already started), so it triggers no round."""
        if kind == _ARRIVE:
            job = self.trace.jobs[index]
            is_preemptible = job.id in self.overlay.preemptible
            is_checkpointable = job.id in self.overlay.checkpointable
            work_s = job.runtime_s
            if is_checkpointable and self.overlay.checkpoint_interval_s > 0:
                work_s += (
                    math.floor(job.runtime_s / self.overlay.checkpoint_interval_s)
                    * self.overlay.config.checkpoint_overhead_s
                )
            request = JobRequest(
                id=job.id,
                user=job.user,
                project=job.project,
                gpu_count=job.gpu_count,
                submit_at=job.submit_at,
                gpu_type=job.gpu_type,
                requested_s=job.runtime_s if self._oracle else job.requested_s,
                is_preemptible=is_preemptible,
                is_checkpointable=is_checkpointable,
                checkpoint_interval_s=self.overlay.checkpoint_interval_s if is_checkpointable else None,
                first_submit_at=job.submit_at,
            )
            fits = self._fits(job.gpu_count, job.gpu_type)
            self._meta[job.id] = _Meta(request, job.runtime_s, JobKind.BATCH, fits)
            self.backend.register(
                job.id,
                work_s=work_s,
                is_preemptible=is_preemptible,
                checkpoint_interval_s=request.checkpoint_interval_s,
                restore_s=self.overlay.config.restore_s,
            )
            self._enqueue(request, self._meta[job.id])
        elif kind == _SESSION:
            session = self.overlay.sessions[index]
            request = JobRequest(
                id=session.id,
                user=session.user,
                project=session.project,
                gpu_count=session.gpu_count,
                submit_at=session.submit_at,
                kind=JobKind.INTERACTIVE,
                requested_s=session.requested_s,
                first_submit_at=session.submit_at,
            )
            meta = _Meta(
                request, session.duration_s, JobKind.INTERACTIVE, self._fits(session.gpu_count, None)
            )
            self._meta[session.id] = meta
            self.backend.register(session.id, work_s=session.duration_s)
            self._enqueue(request, meta)
            patience = self.overlay.config.session_patience_s
            if patience > 0:
                self._push(session.submit_at + patience, _ABANDON, index)
        elif kind == _ABANDON:
            return self._abandon(self.overlay.sessions[index].id, t)
        elif kind == _BK_CREATE:
            self._create_booking(self.overlay.bookings[index], t)
        elif kind in (_BK_WAKE, _BK_OWNER_IN, _BK_OWNER_OUT, _BK_END, _BK_NO_SHOW):
            self._booking_event(kind, self.overlay.bookings[index], t)
        # _WAKE (the engine asked for a round) and _TICK: nothing to do but a round
        return True

    def _abandon(self, session_id: str, t: float) -> bool:
        """The session's user gives up: it leaves the queue unserved (if it never started);
        whether it did."""
        meta = self._meta.get(session_id)
        request = self._pending.get(session_id)
        if meta is None or request is None or meta.started_at is not None:
            return False
        del self._pending[session_id]
        self._pending_widths[request.gpu_count] -= 1
        if meta.fits:
            self._feasible_pending -= 1
        self._interactive_gpus -= request.gpu_count
        self._abandoned += 1
        self._abandoned_gpu_s += meta.runtime_s * request.gpu_count
        self.record.interactive_waits_s.append(t - request.submit_at)
        del self._meta[session_id]
        self.backend.forget(session_id)
        return True

    def _handle_transitions(self, t: float) -> bool:
        transitions = self.backend.advance_to(t)
        for tr in transitions:
            meta = self._meta[tr.job_id]
            running = self._running.pop(tr.job_id)
            del self._running_usage[tr.job_id]
            self._alloc_end.pop(tr.job_id, None)
            self._add_segment(meta.kind.value, tr.started_at, tr.started_at + tr.saved_s, len(tr.gpu_ids))
            self._usage.add(
                meta.request.project,
                gpu_value=self._run_value(running.gpu_ids),
                start_at=tr.started_at,
                end_at=tr.at,
            )
            if tr.kind == TransitionKind.COMPLETED and tr.lost_s > 0:
                self.record.lost_gpu_s += tr.lost_s * len(tr.gpu_ids)  # the restore after a resume
                self.record.restore_gpu_s += tr.lost_s * len(tr.gpu_ids)
            if tr.kind == TransitionKind.COMPLETED:
                if meta.kind == JobKind.BATCH:
                    self.record.jobs.append(
                        JobOutcome(
                            id=tr.job_id,
                            user=meta.request.user,
                            gpu_count=meta.request.gpu_count,
                            submit_at=meta.request.submit_at,
                            runtime_s=meta.runtime_s,
                            end_at=t,
                        )
                    )
                    if self.predictor is not None:
                        self.predictor.observe(meta.request, meta.runtime_s)
                del self._meta[tr.job_id]
            else:
                self.record.preemptions += 1
                self.record.lost_gpu_s += tr.lost_s * len(tr.gpu_ids)
                request = dataclasses.replace(
                    running.job,
                    submit_at=t,
                    attempt=running.job.attempt + 1,
                    first_submit_at=meta.request.submit_at,
                )
                self._enqueue(request, meta, saved_s=tr.saved_s)
        return bool(transitions)

    def _add_segment(self, kind: str, start: float, useful_end: float, gpus: int) -> None:
        self.record.segments.append((start, useful_end, gpus))
        by_kind = self.record.useful_gpu_s_by_kind
        by_kind[kind] = by_kind.get(kind, 0.0) + (useful_end - start) * gpus

    # ---- rounds ----

    def _snapshot(self, t: float) -> ClusterSnapshot:
        horizon = t + self.options.horizon_s
        bookings = tuple(
            state.booking for state in self._bookings.values() if state.booking.start_at < horizon
        )
        running = tuple(self._running.values())
        usage = self._usage.usage_at(t, running=self._running_usage.values())
        return ClusterSnapshot(
            cluster=self.inventory.name,
            gpu_types=self.inventory.gpu_types,
            nodes=self.inventory.nodes,
            running=running,
            pending=tuple(self._pending.values()),
            bookings=bookings,
            projects=self._shares.shares(usage) if self._specs else (),
            claims=self._claims.live(t, self._pending, self.config.claim_hold_s),
        )

    def _run_value(self, gpu_ids: tuple[int, ...]) -> float:
        """GPUs x their fair-share value (the portal's ``gpu_count x GpuType.value``)."""
        value = self._gpu_value.get(self._gpu_type_of.get(gpu_ids[0], ""), 1.0) if gpu_ids else 1.0
        return len(gpu_ids) * value

    def _round(self, t: float, *, is_tick: bool = False) -> bool:
        """One engine round at ``t``; True if the plan started or preempted anything.  A still
        tick (`replay_still`) is not planned: it would plan what the last round did."""
        config = self.config
        if self._forecast is not None:
            booked = sum(
                state.plan.gpu_count
                for state in self._bookings.values()
                if state.plan.start_at < t + 3_600.0 and state.plan.end_at > t
            )
            headroom, pool = self._forecast.at(t, booked=booked)
            wanted = ((self._forecast.key, headroom),) if headroom else ()
            if wanted != config.interactive_headroom or pool != config.interactive_pool:
                config = self.config = dataclasses.replace(
                    config, interactive_headroom=wanted, interactive_pool=pool
                )
        snapshot = self._snapshot(t)
        if is_tick and self._still is not None and self._is_still(snapshot, t):
            self._rounds_skipped += 1
            if self.options.verify_still_ticks:
                self._verify_still(snapshot, t)
            return False
        started = time.perf_counter()
        plan = self._plan(snapshot, config, t)
        self.record.round_ms.append((time.perf_counter() - started) * 1000.0)
        results = self.backend.apply(plan)
        acted = False
        by_start = {(r.target_id): r for r in results if r.action == "start"}
        for action in plan.starts:
            result = by_start.get(action.job_id)
            request = self._pending.get(action.job_id)
            if result is None or not result.is_ok or request is None:
                continue
            del self._pending[action.job_id]
            self._pending_widths[request.gpu_count] -= 1
            if request.kind == JobKind.BATCH:
                self._batch_widths[request.gpu_count] -= 1
            meta = self._meta[action.job_id]
            if meta.fits:
                self._feasible_pending -= 1
            if meta.kind == JobKind.INTERACTIVE:
                self._interactive_gpus -= request.gpu_count
            if meta.started_at is None:
                meta.started_at = t
                if meta.kind == JobKind.INTERACTIVE:
                    self.record.interactive_waits_s.append(t - request.submit_at)
            self._alloc_end[action.job_id] = (
                action.expected_end_at
                if math.isfinite(action.expected_end_at)
                else t + (request.requested_s or math.inf)
            )
            gpu_ids = tuple(action.gpu_ids)
            self._running[action.job_id] = RunningJob(request, gpu_ids, t, action.is_preemptible)
            self._running_usage[action.job_id] = (request.project, self._run_value(gpu_ids), t)
            acted = True
        for preempt, result in zip(
            plan.preemptions, [r for r in results if r.action == "preempt"], strict=True
        ):
            running = self._running.get(preempt.job_id)
            if result.is_ok and running is not None and running.grace_until is None:
                self._running[preempt.job_id] = dataclasses.replace(running, grace_until=preempt.kill_at)
                acted = True
                if preempt.for_id in self._pending:  # a job's claim (a booking holds its GPUs)
                    self._claims.signalled(preempt.for_id, preempt.job_id, preempt.kill_at)
        self._fix_bookings(plan, t)
        next_round_at = getattr(plan, "next_round_at", None)  # added to the contract by the engine
        if next_round_at is not None and next_round_at > t and next_round_at not in self._wakes:
            self._wakes.add(next_round_at)
            self._push(next_round_at, _WAKE, 0)
        if self._waiting_owners and self._seat_owners(t):
            acted = True
        self._idle_counts = self._idle_of(plan)
        if self._skips_still_ticks:
            self._remember_still(snapshot, plan, t, acted=acted, free_gpus=self.backend.free_gpu_count)
        return acted

    def _verify_still(self, snapshot: ClusterSnapshot, t: float) -> None:
        plan = self.plan_fn(snapshot, policy=self.config, now=t)
        why = still_plan_difference(plan, self._idle_counts, self._idle_of(plan), wakes=self._wakes, t=t)
        if why is not None:
            raise AssertionError(f"{self.policy}: the still tick at {t} was not still: {why}")

    def _idle_of(self, plan: Plan) -> Counter[str]:
        """The plan's idle reasons per free GPU (those it does not explain: `unexplained`)."""
        counts: Counter[str] = Counter()
        explained = 0
        is_free = self.backend.is_free
        for gpu_id, reason in plan.idle:
            if is_free(gpu_id):
                counts[_REASON_VALUE[reason]] += 1
                explained += 1
        missing = self.backend.free_gpu_count - explained
        if missing > 0:
            counts[UNEXPLAINED] += missing
        return counts

    def _finish(self, wall_start: float) -> None:
        record = self.record
        for job_id, meta in self._meta.items():
            if meta.kind == JobKind.BATCH:
                record.jobs.append(
                    JobOutcome(
                        id=job_id,
                        user=meta.request.user,
                        gpu_count=meta.request.gpu_count,
                        submit_at=meta.request.submit_at,
                        runtime_s=meta.runtime_s,
                        end_at=None,
                    )
                )
            elif meta.started_at is None:
                record.interactive_waits_s.append(self._last_t - meta.request.submit_at)
        for state in list(self._bookings.values()):
            self._close_booking(state, self._last_t)
        record.span_start = 0.0
        record.span_end = self._last_t  # the last event: the last completion or booking end
        record.wall_s = time.perf_counter() - wall_start
        counters = self.backend.counters
        record.extra = {
            "refused_starts": counters.refused_starts,
            "double_allocations_refused": counters.double_allocations_refused,
            "preemptions_refused": counters.preemptions_refused,
            "bookings_refused": self.overlay.bookings_refused,
            "bookings_released_no_show": self._released_no_show,
            "sessions": self._sessions_total,
            "sessions_abandoned": self._abandoned,
            "sessions_abandoned_gpu_hours": self._abandoned_gpu_s / 3600.0,
            "restore_gpu_hours": record.restore_gpu_s / 3600.0,
            "rounds_by_trigger": dict(sorted(self._triggers.items())),
            "rounds_skipped": self._rounds_skipped,  # still ticks (`replay_still`), not planned
            "backend_messages": counters.messages[:10],
        }


def run_replay(
    trace: Trace, inventory: Inventory, overlay: Overlay, **setup: Unpack[ReplaySetup]
) -> ReplayRecord:
    """Replay ``trace`` + ``overlay`` on ``inventory`` under ``setup["policy"]``; deterministic
    for a seed (see `ReplaySetup` for the arguments)."""
    return Replay(trace, inventory, overlay, **setup).run()
