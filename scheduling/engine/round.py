"""The mutable state of one scheduling round, shared by the stages a policy composes.

A `Round` lives for one `plan_round` call.  Building it indexes the snapshot under the policy's
`stages.Model` (runtimes, type preference, partition), places and holds bookings
(`stages.reserve`), records when every GPU is expected free, and builds the free-GPU pools;
the stages (``stages/``) then admit, order, reserve, backfill, reclaim and place jobs through
it, and `explain.build_plan` freezes it into a `Plan`.  It decides nothing itself: it answers
"which types may this job use", "which pool does it draw from", "how much of its project's
guarantee is left", and records starts and preemptions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from scheduling.engine.cluster import RoundState, running_ends
from scheduling.engine.fragmentation import DrainAwareChooser
from scheduling.engine.outcome import Outcome, fmt_s
from scheduling.engine.overdue import correct_overdue
from scheduling.engine.placement import FreePool
from scheduling.engine.pool import BookedWindows, PoolForecast, booked_windows
from scheduling.engine.preemption import is_consenting, is_reclaimable, kill_time
from scheduling.engine.types import (
    Booking,
    ClusterSnapshot,
    JobKind,
    JobRequest,
    PolicyConfig,
    PreemptAction,
    ProjectShare,
    RunningJob,
    StartAction,
)

if TYPE_CHECKING:  # the stages import this module
    from scheduling.engine.backfill import Shadow, Window
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.stages.compose import Composition
    from scheduling.engine.stages.partition import SpanPool
    from scheduling.engine.startability import Unstartable

NodeGpus = tuple[tuple[int, tuple[int, ...]], ...]


class Round:
    """Mutable state of one round; build it, run the stages, then `explain.build_plan`."""

    def __init__(
        self, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float, composition: Composition
    ) -> None:
        """Index the snapshot, place bookings and build the free-GPU pools."""
        from scheduling.engine.stages import reserve  # here: the stages import this module

        self.composition = composition
        model = composition.model
        self.state = state = RoundState(
            snapshot,
            policy,
            now,
            is_predicted=model.is_predicted,
            is_running_predicted=model.is_running_predicted,
        )
        if model.corrects_overdue:
            correct_overdue(state)
        self.out = Outcome()
        self.now = now
        self.policy = policy
        # consenting work can be taken back this round (a reclaim stage is composed)
        self.is_reclaiming = composition.reclaim is not None
        order = state.type_order
        if model.prefers_cheap_types:
            order = tuple(
                sorted(order, key=lambda n: (state.types[n].value, state.types[n].memory_gib, order.index(n)))
            )
        self.type_rank = {name: i for i, name in enumerate(order)}
        # static's partition: its node indexes and their GPUs
        self.partition_nodes, self.partition_gpus = self._partition(
            policy.interactive_partition if model.has_partition else ()
        )
        self.schedulable = state.topology.schedulable
        # GPU -> (p50 end, hold end) of jobs started this round (for profiles and ETAs)
        self.started_end: dict[int, tuple[float, float]] = {}
        self.windows: dict[int, tuple[Window, ...]] = {}
        self.booking_gpus: dict[str, tuple[int, ...]] = {}
        self.active_booking_gpu: dict[int, Booking] = {}
        self.top: JobRequest | None = None
        self.top_shadow: Shadow | None = None
        # the top job has enough free GPUs in total but not together: its idle GPUs are fragments
        self.top_fragmented = False
        # running GPUs (in grace or signalled) promised to a demand earlier in this round
        self.round_promised: set[int] = set()
        # the interactive pool was held this round (or the policy holds none)
        self.headroom_done = composition.pool is None
        self._predicted_end: dict[str, float] = {}
        # the interactive pool over time (None: only ``interactive_headroom`` for now)
        self.pool_forecast = PoolForecast.of(policy) if composition.pool is not None else None
        self._booked: BookedWindows | None = None
        # non-preemptible jobs `admit.pool_admits` refused -> the low-demand window it found
        self.low_windows: dict[str, float] = {}
        # wide jobs that would borrow and wait for smaller work (`fragmentation.defers_wide_borrower`)
        self.deferred_wide: set[str] = set()
        self.pinned_by_type = self._pinned_by_type()
        self._init_caches()
        # static: batch jobs wider than the batch partition, which may span both sides
        self.wide: frozenset[str] = frozenset()
        self.span_pool: SpanPool | None = None
        self._span_nodes: dict[tuple[str, ...], NodeGpus] = {}
        topology = state.topology
        self._max_size = topology.max_size
        free = set(topology.up_gpus.difference(state.running_by_gpu))
        booking_holds = reserve.place_bookings(self, free)
        self._init_availability(free)
        self.drain_chooser = (
            DrainAwareChooser(state, self.active_booking_gpu) if composition.place.is_drain_aware else None
        )
        self.inter_pool, self.batch_pool = self._pools(free, has_partition=model.has_partition)
        reserve.hold_bookings(self, booking_holds, free)
        self._init_quotas()
        if model.has_partition and model.spans_wide_jobs:
            from scheduling.engine.stages.partition import open_span  # here: it imports this module

            open_span(self)

    def _init_caches(self) -> None:
        """The round's memos (they only save work: every answer is the same without them)."""
        self._types_cache: dict[tuple[str, ...], list[str]] = {}
        self._all_types: list[str] | None = None  # `types_for` of an unconstrained job
        # `admit.never_startable_of` per job shape (constraints, size, project, kind, consent)
        self.never_cache: dict[tuple[object, ...], Unstartable | None] = {}
        # project -> whether it has quotas (the never-startable verdict depends on them only then)
        self.quota_projects: dict[str, bool] = {}
        self._nodes_cache: dict[tuple[tuple[str, ...], bool], NodeGpus] = {}
        self._node_ids: dict[int, tuple[NodeGpus, tuple[int, ...]]] = {}  # `nodes_for`
        # a session's demand shape -> (what the round had signalled, promised and held, the
        # pool's takes or None) when its reclaim failed (`stages.reclaim._FailMemo`)
        self.reclaim_failed: dict[tuple[object, ...], tuple[tuple[int, int, int, int], int | None]] = {}
        # the snapshot's running work in its grace period (`stages.reclaim._incoming`)
        self.in_grace: list[RunningJob] | None = None
        # verdicts decided but not recorded yet (`settle`), each given this round; none holds
        # the round itself, or every round would be garbage for the cyclic collector
        self.deferred: list[Callable[[Round], None]] = []

    def settle(self) -> None:
        """Record the deferred verdicts (`stages.backfill.beyond_window`): every reader of
        ``out.verdicts`` after the backfill window calls this first."""
        deferred = self.deferred
        while deferred:
            deferred.pop(0)(self)

    def _partition(self, names: tuple[str, ...]) -> tuple[frozenset[int], frozenset[int]]:
        """The partition's node indexes and their GPUs: the same every round of one inventory,
        kept on the (shared) topology."""
        if not names:
            return frozenset(), frozenset()
        derived = self.state.topology.derived
        key = ("partition", names)
        found = derived.get(key)
        if found is None:
            index, nodes = self.state.node_index, self.state.nodes
            partition = frozenset(index[n] for n in set(names) if n in index)
            found = derived[key] = (partition, frozenset(g for i in partition for g in nodes[i].gpu_ids))
        return found

    def _pinned_by_type(self) -> dict[str, int]:
        """GPUs per type held by work sessions cannot take back (batch work without consent
        that did not start lent: `preemption.is_consenting`); only with a pool forecast."""
        pinned: dict[str, int] = {}
        if self.pool_forecast is None:
            return pinned
        state = self.state
        for running in state.snapshot.running:
            if running.job.kind == JobKind.BATCH and not is_consenting(running):
                for gpu in running.gpu_ids:
                    name = state.gpu_type.get(gpu, "")
                    pinned[name] = pinned.get(name, 0) + 1
        return pinned

    def _pools(self, free: set[int], *, has_partition: bool) -> tuple[FreePool, FreePool]:
        """(interactive pool, batch pool): the partition's free GPUs and the rest (static), else
        one pool for both."""
        if has_partition:
            partition_gpus = self.partition_gpus
            return self._pool(free & partition_gpus), self._pool(free - partition_gpus)
        pool = self._pool(free)
        return pool, pool

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
        # when a checkpointing preemptible job's GPUs could be back if the top job suspended it
        # now (what `reclaim.suspendable_for` may take, before its per-job tests)
        self.avail_reclaim: dict[int, float] = {}
        can_preempt = self.is_reclaiming
        no_one: set[str] = set()
        up = state.topology.up_gpus
        self.avail_p50 = avail_p50 = dict.fromkeys(free, now)
        self.avail_hold = avail_hold = dict.fromkeys(free, now)
        avail_reclaim, end_p50, end_hold = self.avail_reclaim, state.end_p50, state.end_hold
        for running in state.snapshot.running:
            job_id = running.job.id
            p50 = end_p50[job_id]
            hold = end_hold[job_id]
            reclaim_at = (
                kill_time(state, running)
                if can_preempt and running.job.is_checkpointable and is_reclaimable(running, excluded=no_one)
                else None
            )
            for gpu in running.gpu_ids:
                if gpu in up:
                    avail_p50[gpu] = p50
                    avail_hold[gpu] = hold
                    if reclaim_at is not None:
                        avail_reclaim[gpu] = reclaim_at
        for gpu, booking in self.active_booking_gpu.items():
            if gpu in up and gpu not in self.avail_p50:
                self.avail_p50[gpu] = self.avail_hold[gpu] = booking.end_at

    # ---- where a job may go ----

    def types_for(self, job: JobRequest) -> list[str]:
        """Eligible types of a job in this policy's preference order."""
        if job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            # the common unconstrained job: every type (`RoundState.eligible_types`)
            cached = self._all_types
            if cached is None:
                order = self.state.type_order
                cached = self._all_types = self._types_cache.get(order)
                if cached is None:
                    cached = self._all_types = self._types_cache[order] = sorted(
                        order, key=self.type_rank.__getitem__
                    )
            return cached
        eligible = self.state.eligible_types(job)
        cached = self._types_cache.get(eligible)
        if cached is None:
            cached = self._types_cache[eligible] = sorted(eligible, key=self.type_rank.__getitem__)
        return cached

    def pool_for(self, job: JobRequest) -> FreePool:
        """The free GPUs a job draws from: the partition's for sessions (static), else all."""
        if self.span_pool is not None and job.id in self.wide:
            return self.span_pool  # type: ignore[return-value]  # duck-typed FreePool
        return self.inter_pool if job.kind == JobKind.INTERACTIVE else self.batch_pool

    def nodes_for(self, job: JobRequest | None, types: Sequence[str]) -> tuple[int, ...]:
        """Schedulable node indexes of the given types that the job may use (static partition),
        in node order; one tuple per `node_gpus_for` answer and round (`preemption.plan_reclaim`
        keeps its per-round node index under it)."""
        node_gpus = self.node_gpus_for(job, types)
        found = self._node_ids.get(id(node_gpus))
        if found is None or found[0] is not node_gpus:
            # keyed by identity, the answer kept alongside: `node_gpus_for`'s answers live as
            # long as the round, and a 1,000-node tuple hashed per call would cost more
            found = self._node_ids[id(node_gpus)] = (node_gpus, tuple(i for i, _gpus in node_gpus))
        return found[1]

    def node_gpus_for(self, job: JobRequest | None, types: Sequence[str]) -> NodeGpus:
        """(node index, GPU ids) of `nodes_for`, in node order; built once per round and key.

        A static wide job (`partition`) may use the nodes of both partitions."""
        if job is not None and self.wide and job.id in self.wide:
            return self._span_node_gpus(types)
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

    def _span_node_gpus(self, types: Sequence[str]) -> NodeGpus:
        key = tuple(types)
        found = self._span_nodes.get(key)
        if found is None:
            wanted = set(types)
            nodes = self.state.nodes
            found = self._span_nodes[key] = tuple(
                (i, nodes[i].gpu_ids) for i in self.schedulable if nodes[i].gpu_type in wanted
            )
        return found

    def is_single_node(self, types: Sequence[str], gpu_count: int) -> bool:
        """Whether a gang of ``gpu_count`` fits on one node of one of ``types``."""
        if len(types) == 1:  # the common case, without the generator
            return gpu_count <= self._max_size.get(types[0], 0)
        return gpu_count <= max((self._max_size.get(t, 0) for t in types), default=0)

    # ---- quotas ----

    def _init_quotas(self) -> None:
        state = self.state
        projects = state.snapshot.projects
        # a comprehension, not ``dict(zip(map(attrgetter(...))))``: attrgetter on a slotted class
        # is a generic getattr (half the speed over the overlay's 75-250 projects, every round)
        self.shares: dict[str, ProjectShare] = {share.name: share for share in projects}
        self._limits: dict[str, int | None] = {}  # `limit` per project (the shares are fixed)
        self._has_limits: bool | None = None  # `has_limits`, once asked
        self.used: dict[str, int] = {}
        self.guaranteed_used: dict[tuple[str, str], int] = {}
        # (project, GPU type) -> GPUs it runs, lent or not (per-type limits, `engine.quota`)
        self.used_by_type: dict[tuple[str, str], int] = {}
        has_quotas = False  # a loop, as `has_limits` (a generator in ``any`` is slower)
        for share in self.shares.values():
            if share.guaranteed or share.borrow_limit is not None or share.borrow_limits:
                has_quotas = True
                break
        used, used_by_type, guaranteed_used = self.used, self.used_by_type, self.guaranteed_used
        type_of = state.gpu_type.get
        for running in state.snapshot.running:
            project = running.job.project
            gpu_ids = running.gpu_ids
            used[project] = used.get(project, 0) + len(gpu_ids)
            is_guaranteed = has_quotas and not running.is_preemptible
            types = [type_of(gpu, "") for gpu in gpu_ids]
            if types and types.count(types[0]) == len(types):
                # every GPU of one type: the GPU-by-GPU counts below in one step (the same
                # integers, the same key inserted first; a KTH job runs on up to 100 GPUs)
                key = (project, types[0])
                used_by_type[key] = used_by_type.get(key, 0) + len(types)
                if is_guaranteed:
                    guaranteed_used[key] = guaranteed_used.get(key, 0) + len(types)
                continue
            for gpu_type in types:
                key = (project, gpu_type)
                used_by_type[key] = used_by_type.get(key, 0) + 1
                if is_guaranteed:
                    guaranteed_used[key] = guaranteed_used.get(key, 0) + 1

    def has_limits(self) -> bool:
        """Whether some project has a total limit (`limit`); asked once per round (a loop: a
        generator in ``any`` costs three times as much over the overlay's 75-250 projects)."""
        found = self._has_limits
        if found is None:
            found = False
            for share in self.shares.values():
                if share.borrow_limit is not None:
                    found = True
                    break
            self._has_limits = found
        return found

    def limit(self, project: str) -> int | None:
        """A project's total GPU limit (guaranteed + borrowable), None without one."""
        limits = self._limits
        if project in limits:
            return limits[project]
        share = self.shares.get(project)
        if share is None or share.borrow_limit is None:
            found = None
        else:
            found = sum(n for _t, n in share.guaranteed) + share.borrow_limit
        limits[project] = found
        return found

    def guarantee_left(self, project: str, gpu_type: str) -> int | None:
        """Guaranteed GPUs of a type not yet used by non-preemptible work (None: no quota)."""
        share = self.shares.get(project)
        if share is None or (not share.guaranteed and share.borrow_limit is None and not share.borrow_limits):
            return None
        total = sum(n for t, n in share.guaranteed if t in (gpu_type, "*"))
        return total - self.guaranteed_used.get((project, gpu_type), 0)

    def is_over_limit(self, job: JobRequest) -> bool:
        """Whether starting the job would take its project past its total limit."""
        limit = self.limit(job.project)
        return limit is not None and self.used.get(job.project, 0) + job.gpu_count > limit

    def is_within_guarantee(self, job: JobRequest, types: Sequence[str]) -> bool:
        """Whether the job's project has a guarantee of a fitting type that covers it."""
        return any(
            (left := self.guarantee_left(job.project, t)) is not None and left >= job.gpu_count for t in types
        )

    # ---- actions ----

    def start(self, job: JobRequest, gpus: tuple[int, ...], estimate: Estimate, *, is_lent: bool) -> None:
        """Start ``job`` on ``gpus`` now (lent: reclaimable) and account for it."""
        state = self.state
        self.pool_for(job).take(gpus)
        nodes: list[str] = []
        now = self.now
        p50_end = now + estimate.p50_s
        hold_end = now + estimate.hold_s
        ends = (p50_end, hold_end)
        avail_reclaim = self.avail_reclaim
        # looked up once per start, not once per GPU (a round starts thousands of jobs)
        all_nodes, gpu_node = state.nodes, state.gpu_node
        started_end, avail_p50, avail_hold = self.started_end, self.avail_p50, self.avail_hold
        for gpu in gpus:
            node_id = all_nodes[gpu_node[gpu]].id
            if node_id not in nodes:
                nodes.append(node_id)
            started_end[gpu] = ends
            avail_p50[gpu] = p50_end
            avail_hold[gpu] = hold_end
            if avail_reclaim:
                avail_reclaim.pop(gpu, None)
        if self.drain_chooser is not None:
            self.drain_chooser.note_start(gpus, is_lent=is_lent, end_at=p50_end)
        self.out.starts.append(
            StartAction(
                job_id=job.id,
                gpu_ids=gpus,
                node_ids=tuple(nodes),
                is_preemptible=is_lent,
                expected_end_at=hold_end,
            )
        )
        self.used[job.project] = self.used.get(job.project, 0) + len(gpus)
        type_key = (job.project, state.gpu_type[gpus[0]])
        self.used_by_type[type_key] = self.used_by_type.get(type_key, 0) + len(gpus)
        if (
            self.pool_forecast is not None
            and job.kind == JobKind.BATCH
            and not (is_lent or job.is_preemptible)
        ):
            name = state.gpu_type[gpus[0]]
            self.pinned_by_type[name] = self.pinned_by_type.get(name, 0) + len(gpus)
        if not is_lent:
            for gpu in gpus:
                key = (job.project, state.gpu_type[gpu])
                self.guaranteed_used[key] = self.guaranteed_used.get(key, 0) + 1

    def preempt(self, running: RunningJob, *, for_id: str, why: str, is_high_class: bool = False) -> None:
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

    # ---- when GPUs come free ----

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

    def predicted_end(self, running: RunningJob) -> float:
        """A running job's expected end from its runtime prediction (p50, with berth's upward
        correction past it), whatever the policy plans reservations with."""
        cached = self._predicted_end.get(running.job.id)
        if cached is None:
            cached = self._predicted_end[running.job.id] = running_ends(
                running, self.now, self.policy, is_predicted=True
            )[0]
        return cached

    def booked_windows(self) -> BookedWindows:
        """The windows of the bookings not over yet (`pool.booked_windows`), built once."""
        if self._booked is None:
            self._booked = booked_windows(self.state.snapshot.bookings, self.now)
        return self._booked

    def headroom_levels(self) -> tuple[tuple[str, int], ...]:
        """The interactive level to hold now: the pool forecast's current hour when there is a
        forecast over time, else ``interactive_headroom``."""
        if self.pool_forecast is not None:
            return self.pool_forecast.type_levels_at(self.now)
        return self.policy.interactive_headroom
