"""One round of scheduling: admit -> order -> place -> explain, shared by every policy.

A `Scheduler` lives for one `plan_round` call.  The policies (``policies/``) only choose its
`Knobs` and the order of the passes; the passes themselves are here:

* bookings: choose GPUs (when the portal left it to the engine), hold them, and (berth)
  reclaim lent work in time;
* the EASY pass: start jobs in priority order while they fit; the first that does not becomes
  the *top job* and gets a shadow reservation; later jobs backfill only if they leave reserved
  GPUs in time (on their estimate) or, with lending, as preemptible work;
* berth extras: sessions and bookings reclaim consenting work within a grace, the time-aware
  interactive pool (`pool.py`) held idle but lendable and kept free of non-preemptible work
  at its forecast peak, the top job suspends long checkpointing work in its way
  (`_suspendable_for`), quota guarantees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from scheduling.engine.backfill import Shadow, Window, earliest_start
from scheduling.engine.booking_fit import cheapest_booking_gpus
from scheduling.engine.cluster import Estimate, RoundState, running_ends
from scheduling.engine.fragmentation import DrainAwareChooser, reclaim_for_wide
from scheduling.engine.headroom import headroom_need, may_use_headroom
from scheduling.engine.outcome import Outcome
from scheduling.engine.overdue import correct_overdue
from scheduling.engine.placement import INF, FreePool, Hold, constraint_key
from scheduling.engine.pool import PoolForecast, ends_before_rise
from scheduling.engine.preemption import (
    Reclaim,
    demand_may_take,
    is_cheap_to_reclaim,
    is_costly_start,
    is_reclaimable,
    kill_time,
    plan_reclaim,
)
from scheduling.engine.quota import type_limit
from scheduling.engine.startability import Unstartable, never_startable
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    JobKind,
    JobRequest,
    PendingReason,
    PolicyConfig,
    PreemptAction,
    ReserveAction,
    RunningJob,
    StartAction,
)

HEADROOM = "interactive-headroom"
# The top job may suspend checkpointing work whose predicted remaining time exceeds this many
# times its own predicted runtime (`Scheduler._suspendable_for`).
SUSPEND_RATIO = 4.0


@dataclass(frozen=True, slots=True)
class Knobs:
    """What distinguishes the policies; see ``policies/``."""

    is_predicted: bool = False  # backfill and ETAs on predicted runtimes (else user estimates)
    can_preempt: bool = False  # reclaim lent work for higher-class demand
    can_lend: bool = False  # start preemptible work on held / headroom GPUs
    has_partition: bool = False  # static interactive partition
    prefers_cheap_types: bool = False  # place on the least valuable fitting GPU type first
    enforces_guarantees: bool = False  # work above a project's guarantee runs preemptible only
    fits_on_p50: bool = False  # backfill if the median runtime fits (else the planning estimate)
    shadow_on_requested: bool = False  # running jobs' ends from user estimates even when predicting
    preempts_by_consent: bool = False  # checkpointing preemptible jobs outside a guarantee run reclaimable
    drain_aware: bool = False  # place where nodes' expected drain is delayed least (fragmentation.py)
    corrects_overdue: bool = False  # jobs past their user limit are expected to run on (overdue.py)


_FMT_CACHE: dict[tuple[int, int], str] = {}


def fmt_s(seconds: float) -> str:
    """A duration for humans: 45 s, 12 min, 3.5 h, 2.1 d (memoised: explanations call it a lot)."""
    if seconds < 90:
        key = (0, round(max(seconds, 0.0)))
    elif seconds < 5_400:
        key = (1, round(seconds / 60))
    elif seconds < 172_800:
        key = (2, round(seconds / 360))
    else:
        key = (3, round(seconds / 8_640))
    text = _FMT_CACHE.get(key)
    if text is None:
        unit, value = key
        text = (f"{value} s", f"{value} min", f"{value / 10:.1f} h", f"{value / 10:.1f} d")[unit]
        if len(_FMT_CACHE) < 100_000:
            _FMT_CACHE[key] = text
    return text


class Scheduler:
    """Mutable state of one round; build it, run passes, then `explain.build_plan`."""

    def __init__(self, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float, knobs: Knobs) -> None:
        """Index the snapshot, place bookings and build the free-GPU pools."""
        self.knobs = knobs
        self.state = state = RoundState(
            snapshot,
            policy,
            now,
            is_predicted=knobs.is_predicted,
            is_running_predicted=knobs.is_predicted and not knobs.shadow_on_requested,
        )
        if knobs.corrects_overdue:
            correct_overdue(state)
        self.out = Outcome()
        self.now = now
        self.policy = policy
        order = state.type_order
        if knobs.prefers_cheap_types:
            order = tuple(
                sorted(order, key=lambda n: (state.types[n].value, state.types[n].memory_gib, order.index(n)))
            )
        self.type_rank = {name: i for i, name in enumerate(order)}
        partition = set(policy.interactive_partition) if knobs.has_partition else set()
        self.partition_nodes = (
            frozenset(state.node_index[n] for n in partition if n in state.node_index)
            if partition
            else frozenset()
        )
        self.schedulable = state.topology.schedulable
        # GPU -> (p50 end, hold end) of jobs started this round (for profiles and ETAs)
        self.started_end: dict[int, tuple[float, float]] = {}
        self.windows: dict[int, list[Window]] = {}
        self.booking_gpus: dict[str, tuple[int, ...]] = {}
        self.active_booking_gpu: dict[int, Booking] = {}
        self.top: JobRequest | None = None
        self.top_shadow: Shadow | None = None
        # the top job has enough free GPUs in total but not together: its idle GPUs are fragments
        self.top_fragmented = False
        # running GPUs (in grace or signalled) promised to a demand earlier in this round
        self.round_promised: set[int] = set()
        self._headroom_done = False
        self._predicted_end: dict[str, float] = {}
        # berth: the interactive pool over time (None: only ``interactive_headroom`` for now)
        self.pool_forecast = PoolForecast.of(policy) if knobs.can_lend else None
        # GPUs per type held by work sessions cannot take back cheaply (batch work without
        # consent, and restartable work: `preemption.is_cheap_to_reclaim`)
        self.pinned_by_type: dict[str, int] = {}
        if self.pool_forecast is not None:
            for running in state.snapshot.running:
                if running.job.kind == JobKind.BATCH and not is_cheap_to_reclaim(running):
                    for gpu in running.gpu_ids:
                        name = state.gpu_type.get(gpu, "")
                        self.pinned_by_type[name] = self.pinned_by_type.get(name, 0) + 1
        self._types_cache: dict[tuple[str, ...], list[str]] = {}
        self._never_cache: dict[tuple[object, ...], Unstartable | None] = {}
        self._nodes_cache: dict[tuple[tuple[str, ...], bool], tuple[tuple[int, tuple[int, ...]], ...]] = {}
        topology = state.topology
        self._max_size = topology.max_size
        free = set(topology.up_gpus.difference(state.running_by_gpu))
        self._place_bookings(free)
        self._init_availability(free)
        self.drain_chooser = DrainAwareChooser(state, self.active_booking_gpu) if knobs.drain_aware else None
        if knobs.has_partition:
            partition_gpus = {g for i in self.partition_nodes for g in state.nodes[i].gpu_ids}
            self.inter_pool = self._pool(free & partition_gpus)
            self.batch_pool = self._pool(free - partition_gpus)
        else:
            self.batch_pool = self._pool(free)
            self.inter_pool = self.batch_pool
        self._hold_bookings()
        self._init_quotas()

    def _pool(self, free: set[int]) -> FreePool:
        topology = self.state.topology
        return FreePool(
            free,
            gpu_node=topology.gpu_node,
            node_types=topology.node_types,
            max_size=topology.max_size,
            chooser=self.drain_chooser,
        )

    def _init_availability(self, free: set[int]) -> None:
        """Expected free time of every schedulable GPU (p50 and planning), updated by starts."""
        state = self.state
        now = self.now
        self.avail_p50: dict[int, float] = {}
        self.avail_hold: dict[int, float] = {}
        # berth: when a checkpointing preemptible job's GPUs could be back if the top job
        # suspended it now (what `_suspendable_for` may take, before its per-job tests)
        self.avail_reclaim: dict[int, float] = {}
        can_preempt = self.knobs.can_preempt
        no_one: set[str] = set()
        up = state.topology.up_gpus
        self.avail_p50 = dict.fromkeys(free, now)
        self.avail_hold = dict.fromkeys(free, now)
        for running in state.snapshot.running:
            job_id = running.job.id
            p50 = state.end_p50[job_id]
            hold = state.end_hold[job_id]
            reclaim_at = (
                kill_time(state, running)
                if can_preempt and running.job.is_checkpointable and is_reclaimable(running, excluded=no_one)
                else None
            )
            for gpu in running.gpu_ids:
                if gpu in up:
                    self.avail_p50[gpu] = p50
                    self.avail_hold[gpu] = hold
                    if reclaim_at is not None:
                        self.avail_reclaim[gpu] = reclaim_at
        for gpu, booking in self.active_booking_gpu.items():
            if gpu in up and gpu not in self.avail_p50:
                self.avail_p50[gpu] = self.avail_hold[gpu] = booking.end_at

    # ---- helpers ----

    def types_for(self, job: JobRequest) -> list[str]:
        """Eligible types of a job in this policy's preference order."""
        eligible = self.state.eligible_types(job)
        cached = self._types_cache.get(eligible)
        if cached is None:
            cached = self._types_cache[eligible] = sorted(eligible, key=self.type_rank.__getitem__)
        return cached

    def pool_for(self, job: JobRequest) -> FreePool:
        return self.inter_pool if job.kind == JobKind.INTERACTIVE else self.batch_pool

    def nodes_for(self, job: JobRequest | None, types: Sequence[str]) -> Iterator[int]:
        """Schedulable node indexes of the given types that the job may use (static partition)."""
        return (i for i, _gpus in self.node_gpus_for(job, types))

    def node_gpus_for(
        self, job: JobRequest | None, types: Sequence[str]
    ) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(node index, GPU ids) of `nodes_for`, in node order; built once per round and key."""
        is_interactive = job is None or job.kind == JobKind.INTERACTIVE
        key = (tuple(types), is_interactive)
        cached = self._nodes_cache.get(key)
        if cached is None:
            partition = self.partition_nodes
            # the same nodes every round of one inventory: kept on the (shared) topology
            shared = self.state.topology.derived
            shared_key = ("node_gpus_for", key, partition)
            cached = shared.get(shared_key)
            if cached is None:
                wanted = set(types)
                nodes = self.state.nodes
                cached = shared[shared_key] = tuple(
                    (i, nodes[i].gpu_ids)
                    for i in self.schedulable
                    if nodes[i].gpu_type in wanted
                    and not (partition and ((i in partition) != is_interactive))
                )
            self._nodes_cache[key] = cached
        return cached

    def is_single_node(self, types: Sequence[str], gpu_count: int) -> bool:
        return gpu_count <= max((self._max_size.get(t, 0) for t in types), default=0)

    # ---- bookings ----

    def _booking_availability(self, gpu: int, free: set[int]) -> float:
        if gpu in free:
            return self.now
        running = self.state.running_by_gpu.get(gpu)
        if running is None:
            return INF
        end = self.state.end_hold[running.job.id]
        if (
            self.knobs.can_preempt
            and is_reclaimable(running, excluded=set())
            and is_cheap_to_reclaim(running)
        ):
            end = min(end, kill_time(self.state, running, is_high_class=True))
        return end

    def _booking_available(
        self, types: Sequence[str], blocked: set[int], free: set[int], ends: dict[int, float]
    ) -> dict[int, float]:
        """``ends``: this round's `_booking_availability` of GPUs not free (it depends only on
        what runs there), filled as asked, shared by the bookings placed in one round."""
        available: dict[int, float] = {}
        now = self.now
        for _i, gpu_ids in self.node_gpus_for(None, types):
            for gpu in gpu_ids:
                if gpu in blocked:
                    continue
                if gpu in free:
                    available[gpu] = now
                    continue
                at = ends.get(gpu)
                if at is None:
                    at = ends[gpu] = self._booking_availability(gpu, free)
                if at < INF:
                    available[gpu] = at
        return available

    def _place_bookings(self, free: set[int]) -> None:
        state = self.state
        bookings = sorted(
            (b for b in state.snapshot.bookings if b.end_at > self.now),
            key=lambda b: (b.start_at, b.id),
        )
        taken: list[tuple[Booking, tuple[int, ...]]] = [(b, b.gpu_ids) for b in bookings if b.gpu_ids]
        ends: dict[int, float] = {}
        for booking in bookings:
            gpus = booking.gpu_ids
            if not gpus:
                blocked = {
                    g
                    for other, other_gpus in taken
                    if other.start_at < booking.end_at and booking.start_at < other.end_at
                    for g in other_gpus
                }
                types = state.booking_types(booking)
                single = self.is_single_node(types, booking.gpu_count)
                # berth: GPUs that waste least until the booking (see booking_fit)
                cheapest = (
                    cheapest_booking_gpus(self, booking, types, blocked, free)
                    if self.knobs.can_preempt
                    else None
                )
                shadow = (
                    Shadow(booking.start_at, cheapest)
                    if cheapest is not None
                    else earliest_start(
                        node_gpus=self.node_gpus_for(None, types),
                        available=self._booking_available(types, blocked, free, ends),
                        gpu_count=booking.gpu_count,
                        is_single_node=single,
                        duration_s=0.0,
                        windows={},
                    )
                )
                if shadow is None:
                    self.out.notes.append(
                        f"Booking {booking.id}: no {booking.gpu_count} GPUs of a fitting type exist."
                    )
                    continue
                gpus = shadow.gpu_ids
                taken.append((booking, gpus))
            self.booking_gpus[booking.id] = gpus
            self.out.reservations.append(
                ReserveAction(
                    holder_id=booking.id, gpu_ids=gpus, start_at=booking.start_at, end_at=booking.end_at
                )
            )
            if booking.start_at <= self.now:
                for gpu in gpus:
                    self.active_booking_gpu[gpu] = booking
                    free.discard(gpu)
            else:
                lead_at = booking.start_at - self.policy.booking_lead_s
                for gpu in gpus:
                    self.windows.setdefault(gpu, []).append((lead_at, booking.end_at))
                self.out.wake_at(booking.start_at, self.now)
                if self.knobs.can_preempt:
                    self.out.wake_at(lead_at - self.policy.grace_s, self.now)
        for windows in self.windows.values():
            windows.sort()

    def _hold_bookings(self) -> None:
        for booking in self.state.snapshot.bookings:
            if booking.start_at <= self.now or booking.id not in self.booking_gpus:
                continue
            lead_at = booking.start_at - self.policy.booking_lead_s
            # lent work is evicted when the booking starts: only checkpointing work may borrow
            hold = Hold(
                holder=booking.id,
                normal_until=lead_at,
                lent_until=lead_at,
                is_strict=True,
                is_checkpoint_only=True,
            )
            self.inter_pool.hold(self.booking_gpus[booking.id], hold)
            if self.batch_pool is not self.inter_pool:
                self.batch_pool.hold(self.booking_gpus[booking.id], hold)

    def reclaim_for_bookings(self) -> None:
        """Berth: signal lent work on a booking's GPUs so they are free at its start."""
        state = self.state
        for booking in sorted(state.snapshot.bookings, key=lambda b: (b.start_at, b.id)):
            gpus = self.booking_gpus.get(booking.id)
            if not gpus or booking.end_at <= self.now:
                continue
            signal_at = booking.start_at - self.policy.booking_lead_s - self.policy.grace_s
            if self.now < signal_at:
                continue
            for gpu in gpus:
                running = state.running_by_gpu.get(gpu)
                if running is None:
                    continue
                self.out.promised.update(running.gpu_ids)
                if is_reclaimable(running, excluded=self.out.preempted):
                    self._preempt(
                        running, for_id=booking.id, why=f"booking {booking.id} starts", is_high_class=True
                    )
                elif running.grace_until is None and running.job.id not in self.out.preempted:
                    self.out.notes.append(
                        f"Booking {booking.id}: GPU {gpu} is still running non-preemptible job "
                        f"{running.job.id}; the booking may start late."
                    )

    # ---- quotas ----

    def _init_quotas(self) -> None:
        state = self.state
        self.shares = {share.name: share for share in state.snapshot.projects}
        self.used: dict[str, int] = {}
        self.guaranteed_used: dict[tuple[str, str], int] = {}
        # (project, GPU type) -> GPUs it runs, lent or not (per-type limits, `engine.quota`)
        self.used_by_type: dict[tuple[str, str], int] = {}
        has_quotas = any(
            share.guaranteed or share.borrow_limit is not None or share.borrow_limits
            for share in self.shares.values()
        )
        for running in state.snapshot.running:
            project = running.job.project
            self.used[project] = self.used.get(project, 0) + len(running.gpu_ids)
            for gpu in running.gpu_ids:
                key = (project, state.gpu_type.get(gpu, ""))
                self.used_by_type[key] = self.used_by_type.get(key, 0) + 1
            if has_quotas and not running.is_preemptible:
                for gpu in running.gpu_ids:
                    key = (project, state.gpu_type.get(gpu, ""))
                    self.guaranteed_used[key] = self.guaranteed_used.get(key, 0) + 1

    def _limit(self, project: str) -> int | None:
        share = self.shares.get(project)
        if share is None or share.borrow_limit is None:
            return None
        return sum(n for _t, n in share.guaranteed) + share.borrow_limit

    def _guarantee_left(self, project: str, gpu_type: str) -> int | None:
        """Guaranteed GPUs of a type not yet used by non-preemptible work (None: no quota)."""
        share = self.shares.get(project)
        if share is None or (not share.guaranteed and share.borrow_limit is None and not share.borrow_limits):
            return None
        total = sum(n for t, n in share.guaranteed if t in (gpu_type, "*"))
        return total - self.guaranteed_used.get((project, gpu_type), 0)

    def _within_type_limits(self, job: JobRequest, types: Sequence[str]) -> Sequence[str]:
        """The job's types on which its project stays within guarantee + borrowing limit
        (`quota.type_limit`, every policy: a Slurm QOS GrpTRES per GPU type does the same); when
        none is left, records why it waits."""
        share = self.shares.get(job.project)
        if share is None or not share.borrow_limits:
            return types
        kept = [
            t
            for t in types
            if (limit := type_limit(share, t)) is None
            or self.used_by_type.get((job.project, t), 0) + job.gpu_count <= limit
        ]
        if not kept:
            limits = ", ".join(f"{type_limit(share, t)} {t}" for t in types)
            self.out.wait(
                job.id,
                PendingReason.QUOTA,
                f"Project {job.project} runs as many GPUs as its guarantee and borrowing limit allow "
                f"({limits}); this job needs {job.gpu_count} more and starts when the project's work ends.",
            )
        return kept

    def is_over_limit(self, job: JobRequest) -> bool:
        limit = self._limit(job.project)
        return limit is not None and self.used.get(job.project, 0) + job.gpu_count > limit

    # ---- actions ----

    def start(self, job: JobRequest, gpus: tuple[int, ...], estimate: Estimate, *, is_lent: bool) -> None:
        state = self.state
        self.pool_for(job).take(gpus)
        nodes: list[str] = []
        for gpu in gpus:
            node_id = state.nodes[state.gpu_node[gpu]].id
            if node_id not in nodes:
                nodes.append(node_id)
            self.started_end[gpu] = (self.now + estimate.p50_s, self.now + estimate.hold_s)
            self.avail_p50[gpu] = self.now + estimate.p50_s
            self.avail_hold[gpu] = self.now + estimate.hold_s
            self.avail_reclaim.pop(gpu, None)
        if self.drain_chooser is not None:
            self.drain_chooser.note_start(gpus, is_lent=is_lent, end_at=self.now + estimate.p50_s)
        self.out.starts.append(
            StartAction(
                job_id=job.id,
                gpu_ids=gpus,
                node_ids=tuple(nodes),
                is_preemptible=is_lent,
                expected_end_at=self.now + estimate.hold_s,
            )
        )
        self.used[job.project] = self.used.get(job.project, 0) + len(gpus)
        type_key = (job.project, state.gpu_type[gpus[0]])
        self.used_by_type[type_key] = self.used_by_type.get(type_key, 0) + len(gpus)
        if (
            self.pool_forecast is not None
            and job.kind == JobKind.BATCH
            and not (job.is_checkpointable and (is_lent or job.is_preemptible))
        ):
            name = state.gpu_type[gpus[0]]
            self.pinned_by_type[name] = self.pinned_by_type.get(name, 0) + len(gpus)
        if not is_lent:
            for gpu in gpus:
                key = (job.project, state.gpu_type[gpu])
                self.guaranteed_used[key] = self.guaranteed_used.get(key, 0) + 1

    def preempt(self, running: RunningJob, *, for_id: str, why: str, is_high_class: bool = False) -> None:
        self._preempt(running, for_id=for_id, why=why, is_high_class=is_high_class)

    def _preempt(self, running: RunningJob, *, for_id: str, why: str, is_high_class: bool = False) -> None:
        """Signal a consenting job now; it is killed (and requeued) after the grace and the
        demand's minimum runtime (`preemption.kill_time`)."""
        kill_at = kill_time(self.state, running, is_high_class=is_high_class)
        how = "on lent GPUs" if running.is_preemptible else "as preemptible work"
        self.out.preemptions.append(
            PreemptAction(
                job_id=running.job.id,
                signal_at=self.now,
                kill_at=kill_at,
                reason=(
                    f"Preempted for {why}: it ran {fmt_s(self.now - running.started_at)} {how}; "
                    f"grace until +{fmt_s(kill_at - self.now)}."
                ),
                for_id=for_id,
            )
        )
        self.out.preempted.add(running.job.id)
        self.out.promised.update(running.gpu_ids)

    # ---- the EASY pass ----

    def lent_until(self, job: JobRequest, estimate: Estimate) -> float:
        """Earliest time a lent start of this job could be off its GPUs again.

        Checkpointable work loses little when reclaimed, so it may borrow for as long as its
        minimum runtime; restartable work only where its planning estimate (the p90 under berth)
        fits before the need.
        """
        policy = self.policy
        held = policy.min_runtime_s if job.is_checkpointable else max(estimate.hold_s, policy.min_runtime_s)
        return self.now + held + policy.grace_s

    def try_start(self, job: JobRequest, types: Sequence[str], estimate: Estimate) -> bool:
        """Start the job now if it fits without hurting anything held; lent if it must."""
        pool = self.pool_for(job)
        until = self.now + (estimate.p50_s if self.knobs.fits_on_p50 else estimate.hold_s)
        # a booking is honoured on the user's own limit: predictions are not promises
        strict_until = self.now + max(estimate.hold_s, job.requested_s or 0.0)
        must_lend = False
        types = self._within_type_limits(job, types)
        if not types:
            return False
        if self.knobs.enforces_guarantees and job.kind == JobKind.BATCH:
            left = [self._guarantee_left(job.project, t) for t in types]
            is_within_guarantee = any(x is not None and x >= job.gpu_count for x in left)
            if not is_within_guarantee and all(x is not None for x in left):
                # the project has quotas and this job is above its guarantee: it borrows, as
                # preemptible work (Kueue), whether or not its owner marked it preemptible
                must_lend = True
            elif (
                self.knobs.preempts_by_consent
                and job.is_preemptible
                and job.is_checkpointable
                and not is_within_guarantee
            ):
                # no guarantee covers it and it checkpoints on request: it runs reclaimable, so
                # bookings and sessions can have its GPUs back within a grace at little loss
                must_lend = True
        prefer = self.knobs.prefers_cheap_types
        chooser = self.drain_chooser
        if chooser is not None:
            chooser.is_lendable = job.is_preemptible and job.kind == JobKind.BATCH
        gpus = pool.find(
            types,
            job.gpu_count,
            until=until,
            strict_until=strict_until,
            is_interactive=job.kind == JobKind.INTERACTIVE or may_use_headroom(self, job, types),
            prefer_type_order=prefer,
        )
        if (
            gpus is not None
            and is_costly_start(job)
            and not self._pool_admits(job, gpus, estimate, is_preemptible=must_lend or job.is_preemptible)
        ):
            if chooser is not None:
                chooser.is_lendable = False
            return False
        if gpus is not None:
            if chooser is not None:
                must_lend = must_lend or (chooser.is_lendable and chooser.delays_drain(gpus, INF))
                chooser.is_lendable = False
            self.start(job, gpus, estimate, is_lent=must_lend)
            return True
        if self.knobs.can_lend and job.is_preemptible and job.kind == JobKind.BATCH:
            gpus = pool.find(
                types,
                job.gpu_count,
                until=self.lent_until(job, estimate),
                is_lent=True,
                is_checkpointing=job.is_checkpointable,
                prefer_type_order=prefer,
            )
            if gpus is not None:
                self.start(job, gpus, estimate, is_lent=True)
                return True
        if chooser is not None:
            chooser.is_lendable = False
        return False

    def _pool_admits(
        self, job: JobRequest, gpus: tuple[int, ...], estimate: Estimate, *, is_preemptible: bool = False
    ) -> bool:
        """Berth with a pool forecast: batch work sessions cannot take back cheaply (non-
        preemptible or restartable, `preemption.is_costly_start`) starts only if the GPUs such
        work holds stay within capacity minus the pool's forecast peak until its p90 end.

        Sessions cannot take non-preemptible work back, and taking restartable work back throws
        away all it did, so a start at night that runs into the office peak would make sessions
        wait or waste the work.  Restartable (``is_preemptible``) work predicted to end (p90)
        before the pool's next demand rise is admitted anyway (`pool.ends_before_rise`).  A
        refused job waits with the earliest window of low demand that would admit it as its
        ETA; a job that no window in the forecast admits (wider than the cluster minus the
        lowest level) is not held back, or it could never run.
        """
        forecast = self.pool_forecast
        if forecast is None or job.kind != JobKind.BATCH:
            return True
        state = self.state
        name = state.gpu_type[gpus[0]]
        by_type = state.topology.by_type
        end = self.now + estimate.hold_s
        everything = list(by_type)
        capacity_all = sum(len(g) for g in by_type.values())
        pinned_all = sum(self.pinned_by_type.values())
        room_all = capacity_all - pinned_all - job.gpu_count
        room_type = len(by_type.get(name, ())) - self.pinned_by_type.get(name, 0) - job.gpu_count
        peak_all = forecast.peak(everything, self.now, end)
        peak_type = forecast.peak([name], self.now, end, only_named=True)
        if peak_all <= room_all and peak_type <= room_type:
            return True
        if is_preemptible and ends_before_rise(forecast, [name], self.now, end):
            return True
        window = forecast.low_window(everything, self.now, estimate.hold_s, room_all)
        if window is None:
            return True
        self.out.wait(
            job.id,
            PendingReason.HEADROOM,
            ("It restarts from scratch if reclaimed" if is_preemptible else "It is not preemptible")
            + " and would still run when on-demand sessions are forecast to "
            f"need {peak_all} GPUs; {max(room_all, 0)} GPUs stay free of such work until "
            f"its estimated end. "
            + ("Checkpointing it" if is_preemptible else "Marking it preemptible and checkpointing")
            + " lets it start now; otherwise it waits for "
            f"demand to fall (from about +{fmt_s(max(window - self.now, 0.0))}).",
            max(window, self.now),
        )
        return False

    def availability(self, *, for_job: str, with_reclaim: bool = True) -> dict[int, float]:
        """When each GPU comes free for the top job (missing: not for it)."""
        avail = dict(self.avail_hold)
        if with_reclaim and self.avail_reclaim:
            for gpu, at in self.avail_reclaim.items():
                if at < avail[gpu]:
                    avail[gpu] = at
        for gpu in self.out.promised:
            running = self.state.running_by_gpu.get(gpu)
            if running is not None and running.grace_until is None:
                avail.pop(gpu, None)  # signalled this round for another demand
        for gpu, holder in self.out.claimed.items():
            if holder != for_job:
                avail.pop(gpu, None)
            else:
                avail[gpu] = self.now
        return avail

    def reserve_top(self, job: JobRequest, types: Sequence[str], estimate: Estimate) -> None:
        """Make the blocked head job the top job: reclaim lent work for it, or reserve its shadow."""
        pool = self.pool_for(job)
        single = self.is_single_node(types, job.gpu_count)
        if self.knobs.can_preempt and self._reclaim(job, types, estimate, single=single):
            return
        if self.knobs.can_preempt and reclaim_for_wide(self, job, types, estimate):
            return
        shadow = earliest_start(
            node_gpus=self.node_gpus_for(job, types),
            available=self.availability(for_job=job.id),
            gpu_count=job.gpu_count,
            is_single_node=single,
            duration_s=estimate.hold_s,
            windows=self.windows,
        )
        if shadow is None:
            where = "in the batch partition" if self.partition_nodes else "up"
            self.out.wait(
                job.id,
                PendingReason.CONSTRAINT,
                f"Needs {job.gpu_count} GPUs of type {'/'.join(types)}; not that many are {where} "
                f"(nodes down or draining, or the cluster is too small for it).",
            )
            self.out.verdicts[job.id].has_eta = False
            return
        self.top = job
        self.top_shadow = shadow
        free_total = sum(pool.free_count(t) for t in types)
        # fragmentation only if the free GPUs could not host it even ignoring holds (bookings)
        self.top_fragmented = (
            free_total >= job.gpu_count
            and pool.find(types, job.gpu_count, until=-INF, strict_until=-INF) is None
        )
        # The top job's drain is lent to checkpointing work for as long as it lasts: that work
        # is suspended for the top job once its other GPUs are ready (`_suspendable_for`: it
        # was lent while the top job waited), losing at most a checkpoint interval plus the
        # restore; other work backfills only where it ends in time.
        hold = Hold(
            holder=job.id,
            normal_until=shadow.start_at,
            lent_until=INF,
            is_checkpoint_only=True,
        )
        pool.hold(shadow.gpu_ids, hold)
        self.out.reservations.append(
            ReserveAction(
                holder_id=job.id,
                gpu_ids=shadow.gpu_ids,
                start_at=shadow.start_at,
                end_at=shadow.start_at + estimate.hold_s,
            )
        )
        if self.top_fragmented:
            self.out.wait(
                job.id,
                PendingReason.FRAGMENTATION,
                f"Top of the queue; {free_total} fitting GPUs are free but no node has {job.gpu_count} "
                f"of them together. GPUs are reserved for it from +{fmt_s(shadow.start_at - self.now)}.",
                shadow.start_at,
            )
            return
        self.out.wait(
            job.id,
            PendingReason.RESOURCES,
            f"Top of the queue; needs {job.gpu_count} GPUs, {free_total} fitting ones are free now. "
            f"GPUs are reserved for it from +{fmt_s(shadow.start_at - self.now)}.",
            shadow.start_at,
        )

    def _reclaim(
        self,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        *,
        single: bool,
        is_quota_claim: bool = False,
    ) -> bool:
        """Berth: get GPUs for a blocked session, a guaranteed-quota claim or the top job by
        reclaiming consenting work (see `_suspendable_for` for what the top job may take)."""
        state = self.state
        pool = self.pool_for(job)
        until = self.now + estimate.hold_s
        incoming: dict[int, float] = {}
        for running in state.snapshot.running:
            if running.grace_until is not None or running.job.id in self.out.preempted:
                for gpu in running.gpu_ids:
                    if gpu not in self.out.promised or running.grace_until is not None:
                        incoming[gpu] = max(running.grace_until or self.now, self.now)
        # GPUs promised to a demand earlier in this round are not arriving for this one
        for gpu in self.round_promised:
            incoming.pop(gpu, None)
        is_high_class = job.kind == JobKind.INTERACTIVE or is_quota_claim
        may_take = self._may_take_for(job, types, estimate, single, is_quota_claim=is_quota_claim)
        if not incoming and not any(
            is_reclaimable(running, excluded=self.out.preempted) and (may_take is None or may_take(running))
            for running in state.snapshot.running
        ):
            return False  # no victim and nothing arriving: a plan could only use free GPUs
        reclaim = plan_reclaim(
            state,
            node_indexes=self.nodes_for(job, types),
            gpu_count=job.gpu_count,
            free_on_node=lambda i: pool.node_usable(i, until=until, strict_until=until, is_lent=0),
            incoming=incoming,
            excluded_jobs=self.out.preempted,
            is_single_node=single,
            may_take=may_take,
            is_high_class=is_high_class,
        )
        if reclaim is None or (not reclaim.victims and not reclaim.incoming_gpus):
            return False
        if not is_high_class and not self._worth_reclaiming(job, types, estimate, reclaim, single):
            return False
        for victim in reclaim.victims:
            self._preempt(
                victim.running,
                for_id=job.id,
                why=(
                    "interactive session "
                    if job.kind == JobKind.INTERACTIVE
                    else ("guaranteed quota of job " if is_quota_claim else "top job ")
                )
                + job.id,
                is_high_class=is_high_class,
            )
        pool.take(reclaim.free_gpus)
        for gpu in reclaim.free_gpus:
            self.out.claimed[gpu] = job.id
        self.round_promised.update(reclaim.incoming_gpus)
        self.out.promised.update(reclaim.incoming_gpus)
        if self.top is None and job.kind != JobKind.INTERACTIVE:
            self.top = job
        self.out.wait(
            job.id,
            PendingReason.PREEMPTING,
            f"{len(reclaim.free_gpus)} of its {job.gpu_count} GPUs are free and the rest are being "
            f"reclaimed from preemptible work ({len(reclaim.victims)} job(s) signalled now); "
            f"it starts in about {fmt_s(reclaim.ready_at - self.now)}.",
            reclaim.ready_at,
        )
        self.out.wake_at(reclaim.ready_at, self.now)
        return True

    def _may_take_for(
        self,
        job: JobRequest,
        types: Sequence[str],
        estimate: Estimate,
        single: bool,
        *,
        is_quota_claim: bool,
    ) -> Callable[[RunningJob], bool] | None:
        """Which reclaimable jobs a demand may take: sessions checkpointing work and restartable
        work losing at most what they ask for (`preemption.demand_may_take`); a quota claim the
        same, of other projects' borrowed work only (started above their guarantee or on lent
        capacity: a project's own guarantee is never taken by another's claim); the top job
        what `_suspendable_for` allows."""
        if job.kind == JobKind.INTERACTIVE:
            return demand_may_take(self.state, demand_gpu_s=estimate.hold_s * job.gpu_count)
        if is_quota_claim:
            project = job.project
            affordable = demand_may_take(self.state, demand_gpu_s=estimate.hold_s * job.gpu_count)
            return lambda running: (
                running.is_preemptible and running.job.project != project and affordable(running)
            )
        return self._suspendable_for(job, types, estimate, single)

    def is_within_guarantee(self, job: JobRequest, types: Sequence[str]) -> bool:
        """Whether the job's project has a guarantee of a fitting type that covers it."""
        return any(
            (left := self._guarantee_left(job.project, t)) is not None and left >= job.gpu_count
            for t in types
        )

    def _suspendable_for(
        self, job: JobRequest, types: Sequence[str], estimate: Estimate, single: bool
    ) -> Callable[[RunningJob], bool]:
        """Which running work the top job may suspend to start now (preemptive slowdown order).

        Only checkpointing work whose owner or quota consented (a restart from scratch loses
        everything; a resume loses the work since the last checkpoint plus ``restore_s``), only
        work past its batch minimum runtime (it goes within the grace), only work expected to
        still run at the top job's shadow time (the work really in its way), and of that:

        * work whose predicted remaining time is more than ``SUSPEND_RATIO`` times the top
          job's predicted runtime, however it started: suspending it delays it by a small share
          of what it still has to run while the top job, short next to it, starts now instead
          of at its shadow time (shortest-remaining-first, which is what cuts mean slowdown).
          Each such suspension needs a victim that many times longer than the demand, so a
          suspended job that later heads the queue can only suspend work longer still: chains
          stay short and never come back to the job that suspended it;
        * work lent (started reclaimable) after the top job was queued: it borrowed the top
          job's drain (`reserve_top`) and gives it back.
        """
        latest_kill = self.now + self.policy.grace_s
        end_hold = self.state.end_hold
        state = self.state
        longer_than = self.now + SUSPEND_RATIO * estimate.p50_s
        in_way: list[float] = []  # the shadow time, computed once and only if a cheap test passes

        def in_way_after() -> float:
            if not in_way:
                shadow = self._regular_shadow(job, types, estimate, single)
                in_way.append(-INF if shadow is None else shadow.start_at)
            return in_way[0]

        def may_take(running: RunningJob) -> bool:
            return (
                running.job.is_checkpointable
                and kill_time(state, running) <= latest_kill
                and (
                    self.predicted_end(running) > longer_than
                    or (running.is_preemptible and running.started_at >= job.submit_at)
                )
                and end_hold[running.job.id] >= in_way_after()
            )

        return may_take

    def predicted_end(self, running: RunningJob) -> float:
        """A running job's expected end from its runtime prediction (p50, with berth's upward
        correction past it), whatever the policy plans reservations with."""
        cached = self._predicted_end.get(running.job.id)
        if cached is None:
            cached = self._predicted_end[running.job.id] = running_ends(
                running, self.now, self.policy, is_predicted=True
            )[0]
        return cached

    def _regular_shadow(
        self, job: JobRequest, types: Sequence[str], estimate: Estimate, single: bool
    ) -> Shadow | None:
        """The top job's shadow time if nothing were reclaimed for it."""
        return earliest_start(
            node_gpus=self.node_gpus_for(job, types),
            available=self.availability(for_job=job.id, with_reclaim=False),
            gpu_count=job.gpu_count,
            is_single_node=single,
            duration_s=estimate.hold_s,
            windows=self.windows,
        )

    def _worth_reclaiming(
        self, job: JobRequest, types: Sequence[str], estimate: Estimate, reclaim: Reclaim, single: bool
    ) -> bool:
        """Suspend for the top job only if it gains more than the victims lose.

        The gain is the idle time of the free GPUs the top job would otherwise hold until its
        shadow time (the victims' GPUs stay busy either way); the loss is the victims' work
        since their last checkpoint plus the restore (`RoundState.lost_work_s`).
        """
        if not reclaim.victims:
            return True
        shadow = self._regular_shadow(job, types, estimate, single)
        if shadow is None:
            return True
        gained = (shadow.start_at - reclaim.ready_at) * len(reclaim.free_gpus)
        lost = sum(v.lost_gpu_s for v in reclaim.victims)
        return gained > lost

    def easy_pass(
        self,
        queue: Sequence[JobRequest],
        *,
        interactive_first: bool,
        backfill_order: Sequence[JobRequest] | None = None,
    ) -> None:
        """Start, reserve and backfill ``queue`` (already in priority order).

        Jobs start in queue order until one does not fit: that one becomes the top job.  The
        rest are backfill candidates, taken in ``backfill_order`` when given (berth: shortest
        predicted work first, which leaves the top job itself chosen by age and fair share, so
        its reservation stays put from round to round).
        """
        self._headroom_done = not interactive_first
        position = 0
        while position < len(queue) and self.top is None:
            job = queue[position]
            position += 1
            if not self._admit(job):
                continue
            types = self.types_for(job)
            estimate = self.state.estimate(job)
            if self.try_start(job, types, estimate):
                continue
            if job.id in self.out.verdicts:
                continue  # waits on quota
            if self.knobs.can_preempt:
                single = self.is_single_node(types, job.gpu_count)
                if job.kind == JobKind.INTERACTIVE and self._reclaim(job, types, estimate, single=single):
                    continue
                if (
                    job.kind == JobKind.BATCH
                    and self.is_within_guarantee(job, types)
                    and self._reclaim(job, types, estimate, single=single, is_quota_claim=True)
                ):
                    continue
            self.reserve_top(job, types, estimate)
        rest: Sequence[JobRequest] = queue[position:]
        if backfill_order is not None and rest:
            waiting = {job.id for job in rest}
            rest = [job for job in backfill_order if job.id in waiting]
        scanned = 0
        depth = self.policy.backfill_depth
        for job in rest:
            if not self._admit(job):
                continue
            scanned += 1
            if scanned > depth:
                self.out.wait(
                    job.id,
                    PendingReason.PRIORITY,
                    f"{depth} other jobs are considered first; it is beyond this round's backfill window.",
                )
                continue
            types = self.types_for(job)
            estimate = self.state.estimate(job)
            if self.try_start(job, types, estimate):
                continue
            if job.id in self.out.verdicts:
                continue
            if (
                self.knobs.can_preempt
                and job.kind == JobKind.INTERACTIVE
                and self._reclaim(job, types, estimate, single=self.is_single_node(types, job.gpu_count))
            ):
                continue
            self._explain_blocked(job, types, estimate)
        if not self._headroom_done:
            self.hold_headroom()
            self._headroom_done = True

    def _admit(self, job: JobRequest) -> bool:
        """Whether a job may be considered at all; records why not (constraint, quota limit)."""
        if job.id in self.out.verdicts:
            return False
        if not self._headroom_done and job.kind != JobKind.INTERACTIVE:
            self.hold_headroom()
            self._headroom_done = True
        if not self.state.eligible_types(job):
            self.out.wait(
                job.id,
                PendingReason.CONSTRAINT,
                f"No GPU in cluster {self.state.snapshot.cluster} satisfies its constraints "
                f"(type {job.gpu_type or 'any'}, >= {job.min_memory_gib:g} GiB, "
                f"precisions {', '.join(sorted(job.precisions)) or 'any'}).",
            )
            return False
        if self.is_never_startable(job):
            return False
        if self.is_over_limit(job):
            self.out.wait(
                job.id,
                PendingReason.QUOTA,
                f"Project {job.project} runs {self.used.get(job.project, 0)} GPUs of its limit "
                f"of {self._limit(job.project)}; this job needs {job.gpu_count} more.",
            )
            return False
        return True

    def is_never_startable(self, job: JobRequest) -> bool:
        """Whether no amount of waiting starts ``job`` (`startability`); if so, records its
        reason and what would unblock it, with no ETA."""
        never = self._never_startable(job)
        if never is None:
            return False
        self.out.wait(job.id, never.reason, never.message)
        self.out.verdicts[job.id].has_eta = False
        return True

    def _never_startable(self, job: JobRequest) -> Unstartable | None:
        """`startability.never_startable` on this round's inventory, memoised per job shape."""
        key = (constraint_key(job), job.gpu_count, job.project, job.kind, job.is_preemptible)
        cache = self._never_cache
        if key not in cache:
            snapshot = self.state.snapshot
            cache[key] = never_startable(
                job,
                gpu_types=snapshot.gpu_types,
                nodes=snapshot.nodes,
                share=self.shares.get(job.project),
                is_guarantee_enforced=self.knobs.enforces_guarantees,
            )
        return cache[key]

    def _explain_blocked(self, job: JobRequest, types: Sequence[str], estimate: Estimate) -> None:
        pool = self.pool_for(job)
        free = sum(pool.free_count(t) for t in types)
        top = self.top
        if free >= job.gpu_count:
            ignoring_holds = pool.find(types, job.gpu_count, until=-INF, strict_until=-INF)
            if ignoring_holds is not None:
                holder = pool.hold_of(ignoring_holds[0])
                what = holder.holder if holder is not None else "a reservation"
                whom = (
                    "interactive headroom"
                    if what == HEADROOM
                    else ("the top job " + what if top is not None and what == top.id else "booking " + what)
                )
                self.out.wait(
                    job.id,
                    PendingReason.RESERVATION,
                    f"{free} fitting GPUs are free, but they are held for {whom} and this job's "
                    f"estimated {fmt_s(estimate.hold_s)} would run into that.",
                )
                return
            self.out.wait(
                job.id,
                PendingReason.FRAGMENTATION,
                f"{free} fitting GPUs are free in total, but no node has {job.gpu_count} of them together.",
            )
            return
        ahead = f"; top job {top.id} holds the next free GPUs" if top is not None else ""
        self.out.wait(
            job.id,
            PendingReason.RESOURCES if top is None or top.id == job.id else PendingReason.PRIORITY,
            f"Needs {job.gpu_count} GPUs of type {'/'.join(types)}; {free} are free{ahead}.",
        )

    # ---- headroom ----

    def hold_headroom(self) -> None:
        """Berth: keep ``interactive_headroom`` GPUs idle or running only reclaimable work
        (minus what sessions already use or can reclaim within a grace: `headroom_need`)."""
        levels = self.headroom_levels()
        if not self.knobs.can_lend or not levels:
            return
        pool = self.inter_pool
        forecast = self.pool_forecast
        for type_name, count in levels:
            types = list(self.type_rank) if type_name == "*" else [type_name]
            need = headroom_need(self, types, count)
            if need <= 0:
                continue
            chosen = pool.pick_fragments(types, need)
            # lendable to checkpointing work (a session takes it back within a grace, losing
            # at most a checkpoint interval); with a forecast over time also to restartable
            # work predicted to be gone before the pool's next demand rise
            pool.hold(
                chosen,
                Hold(
                    holder=HEADROOM,
                    normal_until=-INF,
                    lent_until=INF,
                    is_checkpoint_only=True,
                    is_for_interactive=True,
                    restart_until=-INF if forecast is None else forecast.next_rise(types, self.now),
                ),
            )

    def headroom_levels(self) -> tuple[tuple[str, int], ...]:
        """The interactive level to hold now: the pool forecast's current hour when there is a
        forecast over time, else ``interactive_headroom``."""
        if self.pool_forecast is not None:
            return self.pool_forecast.type_levels_at(self.now)
        return self.policy.interactive_headroom
