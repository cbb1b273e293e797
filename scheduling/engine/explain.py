"""Explanations: a reason, a sentence and an ETA for every pending job; one reason per idle GPU.

ETAs come from the availability profile of the job's eligible types (when the k-th GPU of
those types is expected free, on p50 and on the planning estimate) and from the GPU-time of
higher-priority waiting work ahead of it, so a job deep in the queue does not get "in 5 min".
Idle reasons follow one precedence:
down > draining > allocated_but_idle > scheduler_latency > reserved_unused > quota_blocked >
constraint_mismatch > fragmentation > no_demand.

The sentences and ETAs of a long queue are most of a round's cost, and a caller that acts on
the plan (a replay) never reads them, so `build_plan` computes them when ``Plan.pending`` is
first read (see `_LazyPlan`); reason codes and idle reasons are computed at once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from itertools import repeat
from typing import TYPE_CHECKING, Any

from scheduling.engine.collector import collector_paused
from scheduling.engine.outcome import Verdict, fmt_s
from scheduling.engine.types import (
    IdleReason,
    JobRequest,
    Node,
    NodeStatus,
    PendingExplanation,
    PendingReason,
    Plan,
)

if TYPE_CHECKING:
    from scheduling.engine.cluster import Estimate
    from scheduling.engine.round import Round


_Profile = tuple[list[float], list[float], int, float, float]
_EMPTY: _Profile = ([], [], 0, 0.0, 0.0)
_NO_ETA = (PendingReason.CONSTRAINT, PendingReason.QUOTA)
_UNSEEN = object()


def _profiles(sched: Round) -> dict[str, _Profile]:
    """Per type: sorted expected free times (p50, planning) of its usable GPUs, capacity, and
    the GPU-seconds still to run on them (p50, planning)."""
    by_type = sched.state.topology.by_type
    p50 = sched.avail_p50
    hold = sched.avail_hold
    now = sched.now
    profiles: dict[str, _Profile] = {}
    for name, gpus in by_type.items():
        # `[p50.get(g, now) for g in gpus]`, looped in C (8,000 GPUs on the largest benchmark)
        p50s = list(map(p50.get, gpus, repeat(now, len(gpus))))
        holds = list(map(hold.get, gpus, repeat(now, len(gpus))))
        p50s.sort()
        holds.sort()
        backlog50 = sum(p50s) - now * len(gpus)
        backlog90 = sum(holds) - now * len(gpus)
        profiles[name] = (p50s, holds, len(gpus), backlog50, backlog90)
    return profiles


def explain_pending(
    sched: Round, queue: list[JobRequest], *, is_strict_order: bool = False
) -> tuple[PendingExplanation, ...]:
    """One explanation per job of ``queue`` not started this round, in queue order.

    ETA: the later of "its k-th GPU is expected free" and "the work still running plus the
    work queued ahead of it, spread over the type's GPUs, is done" (a fluid bound; gangs and
    reservations can make it later).  With ``is_strict_order`` (fifo) nobody starts before
    the job ahead of it.
    """
    sched.settle()
    started = {start.job_id for start in sched.out.starts}
    verdicts = sched.out.verdicts
    profiles = _profiles(sched)
    now = sched.now
    # per type: its profile, then the p50 and planning GPU-seconds queued ahead so far
    per_type: dict[str, list[Any]] = {}
    estimate_of, types_for = sched.state.estimate, sched.types_for
    floor = [now, now]  # strict order: the ETAs (p50, p90) of the job ahead
    explanations: list[PendingExplanation] = []
    append = explanations.append
    behind: dict[int, Verdict] = {}
    # `types_for` answers with one list per distinct type set (kept by the round): its entries
    # are looked up once per list, not once per job (the list is kept here so its id stays its
    # own); the common case's sentences are kept per (verdict sentence, ETA texts)
    entries_of: dict[int, tuple[object, list[list[Any]]]] = {}
    sentences: dict[tuple[str, str, str], str] = {}
    for job in queue:
        job_id = job.id
        if job_id in started:
            continue
        count = job.gpu_count
        verdict = verdicts.get(job_id)
        if verdict is None:
            verdict = behind.get(count)
            if verdict is None:  # one per size (read only below)
                verdict = behind[count] = Verdict(
                    PendingReason.PRIORITY, f"Waiting behind higher-priority work for {count} GPUs."
                )
        types = types_for(job)
        kept = entries_of.get(id(types))
        if kept is None:
            kept = entries_of[id(types)] = (types, [_type_entry(per_type, profiles, name) for name in types])
        entries = kept[1]
        if len(entries) == 1 and len(entries[0][1]) >= count:
            # `_queue_eta` and `_queue_behind` of one type, written out (the common case)
            p50s, holds, capacity, backlog50, backlog90, ahead50, ahead90 = entry = entries[0]
            eta50 = now + (backlog50 + ahead50) / capacity
            eta90 = now + (backlog90 + ahead90) / capacity
            if not eta50 > p50s[count - 1]:  # the later of the two, as `_queue_eta` has it
                eta50 = p50s[count - 1]
            if not eta90 > holds[count - 1]:
                eta90 = holds[count - 1]
            estimate = estimate_of(job)
            entry[5] = ahead50 + count * estimate.p50_s
            entry[6] = ahead90 + count * estimate.hold_s
        else:
            eta50, eta90 = _queue_eta(entries, count, now)
            if types:
                _queue_behind(entries, count, estimate_of(job))
        if (
            eta50 is not None
            and eta90 is not None
            and verdict.eta_p50_at is None
            and verdict.has_eta
            and not is_strict_order
        ):
            if eta90 < eta50:  # `_explanation` of the common case (a queue ETA only), written out
                eta90 = eta50
            key = (verdict.sentence, fmt_s(eta50 - now), fmt_s(eta90 - now))
            sentence = sentences.get(key)
            if sentence is None:
                sentence = sentences[key] = f"{key[0]} Expected start in {key[1]} (p90 {key[2]})."
            append(_new_explanation(job_id, verdict.reason, sentence, eta50, eta90))
            continue
        strict_floor = floor if is_strict_order else None
        append(
            _explanation(job_id, verdict, eta50, eta90, now, has_types=bool(types), strict_floor=strict_floor)
        )
    return tuple(explanations)


def _queue_behind(entries: list[list[Any]], count: int, estimate: Estimate) -> None:
    """A waiting job is now work queued ahead of the next ones, shared over its types."""
    share = count / len(entries)
    work50 = share * estimate.p50_s
    work90 = share * estimate.hold_s
    for entry in entries:
        entry[5] += work50
        entry[6] += work90


_new = object.__new__
# the slots of the frozen `PendingExplanation`, in field order: a round builds one per waiting
# job, and filling the slots directly gives the same object as the dataclass' ``__init__``
# (that one goes through ``object.__setattr__`` per field, the frozen route, several times slower)
_EXPLANATION_SLOTS = tuple(
    PendingExplanation.__dict__[name].__set__
    for name in ("job_id", "reason", "sentence", "eta_p50_at", "eta_p90_at")
)


def _new_explanation(
    job_id: str, reason: PendingReason, sentence: str, eta50: float | None, eta90: float | None
) -> PendingExplanation:
    """``PendingExplanation(job_id, reason, sentence, eta50, eta90)``, built by its slots."""
    set_id, set_reason, set_sentence, set_p50, set_p90 = _EXPLANATION_SLOTS
    explanation = _new(PendingExplanation)
    set_id(explanation, job_id)
    set_reason(explanation, reason)
    set_sentence(explanation, sentence)
    set_p50(explanation, eta50)
    set_p90(explanation, eta90)
    return explanation


def _type_entry(per_type: dict[str, list[Any]], profiles: dict[str, _Profile], name: str) -> list[Any]:
    """The type's running state in `explain_pending`: its profile plus the GPU-seconds (p50,
    planning) queued ahead so far."""
    entry = per_type.get(name)
    if entry is None:
        p50s, holds, capacity, backlog50, backlog90 = profiles.get(name, _EMPTY)
        entry = per_type[name] = [p50s, holds, capacity, backlog50, backlog90, 0.0, 0.0]
    return entry


def _queue_eta(entries: list[list[Any]], count: int, now: float) -> tuple[float | None, float | None]:
    """Earliest (p50, planning) ETA over the job's types: the later of its ``count``-th GPU
    expected free and the work running plus queued ahead spread over the type's GPUs."""
    eta50: float | None = None
    eta90: float | None = None
    for p50s, holds, capacity, backlog50, backlog90, ahead50, ahead90 in entries:
        if len(holds) < count:
            continue
        t50 = p50s[count - 1]
        t90 = holds[count - 1]
        queue50 = now + (backlog50 + ahead50) / capacity
        queue90 = now + (backlog90 + ahead90) / capacity
        if queue50 > t50:
            t50 = queue50
        if queue90 > t90:
            t90 = queue90
        if eta50 is None or t50 < eta50:
            eta50 = t50
        if eta90 is None or t90 < eta90:
            eta90 = t90
    return eta50, eta90


def _explanation(
    job_id: str,
    verdict: Verdict,
    eta50: float | None,
    eta90: float | None,
    now: float,
    *,
    has_types: bool,
    strict_floor: list[float] | None,
) -> PendingExplanation:
    """The job's explanation from its verdict and queue ETA.  The verdict's own ETA (the top
    job's start, a reclaim, a low-demand window) bounds the queue's; a verdict without ETA
    (cannot start as things are) gets none.  ``strict_floor`` (fifo): the ETAs of the job
    ahead, raised to this job's."""
    own = verdict.eta_p50_at
    if own is not None:
        eta90 = own if eta90 is None else max(eta90, own)
        eta50 = own if eta50 is None else min(max(eta50, now), own)
        if verdict.reason == PendingReason.HEADROOM:
            eta50 = own  # held back until then (the pool's low-demand window), not before
    if not verdict.has_eta:
        eta50 = eta90 = None
    if eta50 is None or eta90 is None or (verdict.reason in _NO_ETA and own is None and not has_types):
        return _new_explanation(job_id, verdict.reason, verdict.sentence, eta50, eta90)
    if strict_floor is not None:
        eta50 = max(eta50, strict_floor[0])
        eta90 = max(eta90, strict_floor[1])
        strict_floor[0], strict_floor[1] = eta50, eta90
    if eta90 < eta50:
        eta90 = eta50
    sentence = f"{verdict.sentence} Expected start in {fmt_s(eta50 - now)} (p90 {fmt_s(eta90 - now)})."
    return _new_explanation(job_id, verdict.reason, sentence, eta50, eta90)


def _still_fragmented(sched: Round, job: JobRequest) -> bool:
    """Whether enough fitting GPUs are still free for the job after this round's starts: a job
    blocked by fragmentation when it was considered may have lost that to later backfill, and
    then the GPUs left idle are not idle because of fragmentation (DESIGN §3.5)."""
    pool = sched.pool_for(job)
    return pool.free_in(sched.types_for(job)) >= job.gpu_count


Kind = tuple[tuple[str, ...], PendingReason]  # (eligible types, reason code) of a waiting job


def waiting_kinds(sched: Round, queue: list[JobRequest]) -> set[Kind]:
    """The distinct (eligible types, reason code) of the jobs of ``queue`` not started this
    round, reasons as `explain_pending` gives them: all idle reasons need to know of the queue
    (a few pairs, however long the queue)."""
    sched.settle()
    started = {start.job_id for start in sched.out.starts}
    verdicts = sched.out.verdicts
    state = sched.state
    eligible_types = state.eligible_types
    type_order = state.type_order
    priority = PendingReason.PRIORITY
    kinds: set[Kind] = set()
    # the verdict of the last unconstrained job: the next one with the very same verdict (a
    # long queue's jobs share a few) adds the very same pair, without hashing it again
    last: object = _UNSEEN
    for job in queue:
        job_id = job.id
        if job_id in started:
            continue
        verdict = verdicts.get(job_id)
        if job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
            if verdict is last:
                continue
            last = verdict
            types = type_order  # what `eligible_types` gives an unconstrained job, without the call
        else:
            types = eligible_types(job)
        kinds.add((types, priority if verdict is None else verdict.reason))
    return kinds


_FRAGMENT_REASONS = frozenset({PendingReason.FRAGMENTATION, PendingReason.PREEMPTING})


def fragmented_types(sched: Round, queue: list[JobRequest], kinds: Collection[Kind]) -> set[str]:
    """GPU types of waiting jobs that fragmentation blocks and that still have enough fitting
    GPUs free in total after this round's starts (`_still_fragmented`); one pass over the queue
    only when some job waits for that reason.  A job whose GPUs are being reclaimed
    (``preempting``) while enough fitting GPUs sit idle in total counts too: it takes others'
    GPUs because the idle ones are not together, so those idle GPUs are fragmentation's, not
    idle for lack of demand."""
    sched.settle()
    if not any(reason in _FRAGMENT_REASONS for _types, reason in kinds):
        return set()
    started = {start.job_id for start in sched.out.starts}
    verdicts = sched.out.verdicts
    types: set[str] = set()
    for job in queue:
        verdict = verdicts.get(job.id)
        if verdict is None or verdict.reason not in _FRAGMENT_REASONS or job.id in started:
            continue
        if _still_fragmented(sched, job):
            types.update(sched.state.eligible_types(job))
    return types


def quota_demand(
    sched: Round, queue: list[JobRequest], kinds: Collection[Kind]
) -> dict[tuple[str, ...], int]:
    """GPUs that quota-blocked waiting jobs could use, per tuple of types they could use them
    on (fitting types with enough GPUs for the whole job): a 2-GPU job held back by its
    project's quota explains at most 2 idle GPUs, not every idle GPU of its types.  One pass
    over the queue only when some job waits for that reason."""
    sched.settle()
    if not any(reason == PendingReason.QUOTA for _types, reason in kinds):
        return {}
    started = {start.job_id for start in sched.out.starts}
    verdicts = sched.out.verdicts
    by_type = sched.state.topology.by_type
    demand: dict[tuple[str, ...], int] = {}
    for job in queue:
        verdict = verdicts.get(job.id)
        if verdict is None or verdict.reason != PendingReason.QUOTA or job.id in started:
            continue
        usable = tuple(t for t in sched.state.eligible_types(job) if len(by_type.get(t, ())) >= job.gpu_count)
        if usable:
            demand[usable] = demand.get(usable, 0) + job.gpu_count
    return demand


# what the idle reasons read of the queue: the waiting jobs' (types, reason) pairs
# (`waiting_kinds`), the types fragmentation explains (`fragmented_types`) and the GPUs
# quota-blocked jobs could use (`quota_demand`; None: every idle GPU of their types)
Demand = tuple[Collection[Kind], Collection[str], "dict[tuple[str, ...], int] | None"]


def idle_reasons(sched: Round, demand: Callable[[], Demand]) -> tuple[tuple[int, IdleReason], ...]:
    """Exactly one reason for every GPU idle after this plan (and for allocated-but-idle ones).

    ``demand`` gives what the reasons read of the queue (`Demand`); it is asked only when an
    idle GPU is not down, draining, claimed, held, booked or in static's partition: only then
    does its reason depend on the waiting jobs.  A long queue's rounds mostly leave no such GPU
    (what is free is held for the top job), and asking walks the whole queue."""
    state = sched.state
    started: set[int] = set(sched.started_end)
    telemetry_idle = state.snapshot.gpus_in_use_idle
    held: set[int] = set()
    fragment_held: set[int] = set()
    top = sched.top
    top_id = top.id if top is not None and sched.top_fragmented and _still_fragmented(sched, top) else None
    for pool in {id(sched.batch_pool): sched.batch_pool, id(sched.inter_pool): sched.inter_pool}.values():
        for gpu in pool.held_gpus():
            hold = pool.hold_of(gpu)
            if hold is not None and hold.holder == top_id:
                fragment_held.add(gpu)
            else:
                held.add(gpu)
    result: list[tuple[int, IdleReason]] = []
    running_by_gpu = state.running_by_gpu
    for gpu in telemetry_idle:
        if gpu in running_by_gpu:
            result.append((gpu, IdleReason.ALLOCATED_BUT_IDLE))
    active = sched.active_booking_gpu
    idle_gpus = set(state.topology.all_gpus).difference(running_by_gpu, started)
    nodes = state.nodes
    gpu_node = state.gpu_node
    claimed = sched.out.claimed
    partition = sched.partition_nodes
    wanted: _Wanted | None = None
    # enum members read once (an enum class attribute costs ~0.17 µs per read on Python 3.11)
    down, draining = NodeStatus.DOWN, NodeStatus.DRAINING
    reserved_unused = IdleReason.RESERVED_UNUSED
    for gpu in sorted(idle_gpus):
        booking = active.get(gpu)
        if booking is not None and booking.is_in_use:
            if gpu in telemetry_idle:
                result.append((gpu, IdleReason.ALLOCATED_BUT_IDLE))
            continue
        i = gpu_node[gpu]
        node = nodes[i]
        idle: IdleReason
        status = node.status
        if status == down:
            idle = IdleReason.DOWN
        elif status == draining:
            idle = IdleReason.DRAINING
        elif gpu in claimed:
            idle = IdleReason.SCHEDULER_LATENCY
        elif gpu in fragment_held:
            idle = IdleReason.FRAGMENTATION  # held for a top job that only fragmentation blocks
        elif booking is not None or gpu in held or i in partition:
            idle = reserved_unused
        else:
            if wanted is None:
                wanted = _Wanted(*demand())
            idle = wanted.reason(node.gpu_type)
        result.append((gpu, idle))
    return tuple(result)


class _Wanted:
    """An idle GPU's reason from the waiting jobs (`Demand`), in `idle_reasons`' precedence:
    quota_blocked > constraint_mismatch > fragmentation > no_demand."""

    __slots__ = ("budget", "eligible", "fragmented", "is_pending", "quota")

    def __init__(
        self,
        kinds: Collection[Kind],
        fragmented: Collection[str],
        quota_wanted: dict[tuple[str, ...], int] | None,
    ) -> None:
        self.is_pending = bool(kinds)
        self.fragmented = fragmented
        self.eligible: set[str] = set()
        quota: set[str] = set()
        for types, reason in kinds:
            self.eligible.update(types)
            if reason == PendingReason.QUOTA:
                quota.update(types)
        # counted down per idle GPU (`_take_quota`), so a copy
        self.budget = dict(quota_wanted) if quota_wanted is not None else None
        if self.budget is not None:
            quota = {t for types in self.budget for t in types}
        self.quota = quota

    def reason(self, gpu_type: str) -> IdleReason:
        """The reason of one idle GPU of ``gpu_type`` (GPUs asked in GPU order)."""
        if not self.is_pending:
            return IdleReason.NO_DEMAND
        if gpu_type in self.quota and _take_quota(self.budget, gpu_type):
            return IdleReason.QUOTA_BLOCKED
        if gpu_type not in self.eligible:
            return IdleReason.CONSTRAINT_MISMATCH
        if gpu_type in self.fragmented:
            return IdleReason.FRAGMENTATION
        return IdleReason.NO_DEMAND


def _take_quota(budget: dict[tuple[str, ...], int] | None, gpu_type: str) -> bool:
    """Count one idle GPU of ``gpu_type`` against a quota-blocked demand that could use it."""
    if budget is None:
        return True
    for types, left in budget.items():
        if left > 0 and gpu_type in types:
            budget[types] = left - 1
            return True
    return False


_UNSET: Any = object()
_PENDING = Plan.__dict__["pending"]  # the slot behind the dataclass field


class _LazyPlan(Plan):
    """A `Plan` whose ``pending`` explanations are computed on first read, then kept.

    It is a `Plan` in every other respect: fields, equality (between plans of this class),
    ``dataclasses.replace``, pickling and ``asdict`` all read ``pending`` and so compute it.
    The explainer reads only the finished `Round`, which nothing changes any more.
    """

    __slots__ = ("_explain",)
    _explain: Callable[[], tuple[PendingExplanation, ...]] | None

    def __init__(
        self, explain: Callable[[], tuple[PendingExplanation, ...]] | None = None, **fields: Any
    ) -> None:
        object.__setattr__(self, "_explain", explain)
        if explain is not None:
            fields["pending"] = _UNSET
        super().__init__(**fields)

    @property
    def pending(self) -> tuple[PendingExplanation, ...]:
        value = _PENDING.__get__(self, Plan)
        if value is _UNSET:
            explain = self._explain
            assert explain is not None, "a lazy plan keeps its explainer until it has run"
            with collector_paused():  # a round's worth of objects, as in `plan_with`
                value = explain()
            _PENDING.__set__(self, value)
            object.__setattr__(self, "_explain", None)
        return value  # type: ignore[no-any-return]

    @pending.setter
    def pending(self, value: tuple[PendingExplanation, ...]) -> None:
        # only the dataclass __init__ and unpickling get here (the plan is frozen)
        _PENDING.__set__(self, value)


def _idle(sched: Round, queue: list[JobRequest]) -> tuple[tuple[int, IdleReason], ...]:
    def demand() -> Demand:
        kinds = waiting_kinds(sched, queue)
        return kinds, fragmented_types(sched, queue, kinds), quota_demand(sched, queue, kinds)

    return idle_reasons(sched, demand)


def build_plan(sched: Round, queue: list[JobRequest], *, is_strict_order: bool = False) -> Plan:
    """Freeze a round's decisions into a `Plan`; explanations are computed when read."""
    out = sched.out
    return _LazyPlan(
        lambda: explain_pending(sched, queue, is_strict_order=is_strict_order),
        starts=tuple(out.starts),
        preemptions=tuple(out.preemptions),
        reservations=tuple(out.reservations),
        releases=tuple(out.releases),
        idle=_idle(sched, queue),
        notes=tuple(out.notes),
        next_round_at=out.next_round_at,
    )


def idle_by_node(
    nodes: Collection[Node], idle: Collection[tuple[int, IdleReason]], *, skip: Collection[int] = ()
) -> dict[str, dict[str, int]]:
    """Idle GPUs per node and reason, ``{node id: {reason: count}}`` (nodes without idle GPUs
    left out); GPUs in ``skip`` (started this round) are not idle.  What a round stores so that
    an idle period can be drilled into by node, not only by reason."""
    node_of = {gpu: node.id for node in nodes for gpu in node.gpu_ids}
    skipped = set(skip)
    out: dict[str, dict[str, int]] = {}
    for gpu, reason in idle:
        if gpu in skipped or gpu not in node_of:
            continue
        counts = out.setdefault(node_of[gpu], {})
        counts[reason.value] = counts.get(reason.value, 0) + 1
    return out
