"""Berth's fragmentation-aware node choice: keep nodes able to drain for wide jobs.

A wide job (a whole 8-GPU node, say) waits for fragmentation when free GPUs are spread over
nodes that each still run something.  Best fit alone (fullest node first) does not prevent it
when runtimes are long-tailed: short jobs leave, long ones stay, one or two per node, and no
node ever empties.  So berth places a job where it delays the moment a node becomes whole
again the least:

* every node has an expected *drain time*: when its last running job is expected to end
  (predicted, with berth's upward correction for jobs that outlived their prediction, so a
  node pinned by a long-running job keeps a late drain time);
* putting a job that is expected off its GPUs at ``until`` on a node delays its drain by
  ``max(0, until - drain)``; that delay costs the node's *other* GPUs (``size - count``) as
  wide-job capacity, so the cost is ``delay x (size - count)`` GPU-seconds.  An empty node has
  drain time ``now``, so breaking it costs the job's whole runtime on all its other GPUs, while
  a job that ends before its node drains anyway costs nothing.  A job that fills a node
  exactly (a 1-GPU job on a 1-GPU node) costs nothing either;
* work that cannot be lent (not preemptible) goes first to nodes that already run such work:
  a node with only lent work can be reclaimed whole for a wide job (see `reclaim_for_wide`);
* costs are compared in factor-of-two classes (runtime predictions are rarely better than
  that), then by the policy's type preference (cheap types first), then best fit (fewest GPUs
  left on the node), then smaller nodes, then the node index for determinism.

So short work goes to nodes pinned by long work, an empty large node is not broken while a
partly used node takes the job at no greater cost, and the node closest to draining is
steered clear of work that would outlive it.

Work that does delay a node's drain starts lent when its owner allows preemption, and a
multi-GPU job blocked for a whole node may reclaim such lent work (after its minimum runtime,
with the grace signal) when it gains more than the victims lose: see `reclaim_for_wide`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduling.engine.cluster import Estimate, RoundState, estimates_by_job, running_ends_from
from scheduling.engine.outcome import claim_label, fmt_s
from scheduling.engine.placement import FreePool
from scheduling.engine.preemption import is_consenting, kill_time, plan_reclaim
from scheduling.engine.types import Booking, JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.round import Round

# Per query, at most this many nodes of a type are scored (tightest fits first, see
# `FreePool.candidates`): it bounds a round's placement cost on large clusters, and the nodes
# left out are the emptiest ones, which are also the costliest to break.
MAX_CANDIDATES = 16

_CostKey = tuple[int, int, int, int, int, int]


def cost_class(cost_gpu_s: float) -> int:
    """0 for no cost, else 1 + floor(log2(1 + GPU-hours)): factor-of-two classes."""
    if cost_gpu_s <= 0.0:
        return 0
    return 1 + int(math.log2(1.0 + cost_gpu_s / 3_600.0))


class DrainAwareChooser:
    """The `placement.NodeChooser` of berth (see the module docstring)."""

    __slots__ = ("_drain", "_gpu_node", "_node_gpus", "_now", "_pinned", "is_lendable")

    def __init__(self, state: RoundState, active_bookings: Mapping[int, Booking]) -> None:
        """Drain times from the snapshot; the round reports its own starts (`note_start`)."""
        self._now = now = state.now
        self._gpu_node = gpu_node = state.gpu_node
        # the same for every round of one inventory: kept on the (shared) topology
        derived = state.topology.derived
        node_gpus = derived.get(("drain_node_gpus",))
        if node_gpus is None:
            node_gpus = derived[("drain_node_gpus",)] = [node.gpu_ids for node in state.nodes]
        self._node_gpus: list[tuple[int, ...]] = node_gpus
        # the job being placed may run lent (set by the place stage around each query)
        self.is_lendable = False
        # nodes running work that cannot be reclaimed: they drain only when it ends
        self._pinned: set[int] = set()
        pinned = self._pinned
        drain: dict[int, float] = {}
        policy = state.policy
        predicted = estimates_by_job(policy, is_predicted=True)
        for running in state.snapshot.running:
            if running.grace_until is not None:
                end = max(running.grace_until, now)
            else:
                end = running_ends_from(running, now, policy, True, predicted)[0]
            is_pinning = not is_consenting(running)
            for gpu in running.gpu_ids:
                node = gpu_node.get(gpu)
                if node is None:
                    continue
                if drain.get(node, now) < end:
                    drain[node] = end
                if is_pinning:
                    pinned.add(node)
        for gpu, booking in active_bookings.items():
            node = self._gpu_node.get(gpu)
            if node is not None and drain.get(node, now) < booking.end_at:
                drain[node] = booking.end_at
        self._drain = drain

    def note_start(self, gpus: Sequence[int], *, is_lent: bool, end_at: float) -> None:
        """Record a start of this round, expected to end at ``end_at`` (p50)."""
        drain = self._drain
        for gpu in gpus:
            node = self._gpu_node[gpu]
            if drain.get(node, self._now) < end_at:
                drain[node] = end_at
            if not is_lent:
                self._pinned.add(node)

    def drain_at(self, node: int) -> float:
        """When the node is expected to have no work left (``now`` if it has none)."""
        return self._drain.get(node, self._now)

    def node_cost(self, node: int, gpu_count: int, until: float) -> float:
        """GPU-seconds of whole-node capacity lost by running ``gpu_count`` GPUs there until ``until``."""
        others = len(self._node_gpus[node]) - gpu_count
        if others <= 0:
            return 0.0
        delay = until - self.drain_at(node)
        return delay * others if delay > 0 else 0.0

    def _pins(self, node: int, gpu_count: int) -> bool:
        """Whether a non-lendable start here would pin a node that only lent work uses so far."""
        return not self.is_lendable and node not in self._pinned and len(self._node_gpus[node]) > gpu_count

    def choose(
        self,
        pool: FreePool,
        gpu_types: Sequence[str],
        gpu_count: int,
        *,
        until: float,
        strict: float,
        mode: int,
    ) -> tuple[int, ...] | None:
        """GPUs for a job (see the module docstring), or None; does not take them."""
        best: tuple[_CostKey, tuple[int, ...]] | None = None
        for rank, name in enumerate(gpu_types):
            if pool.free_count(name) < gpu_count:
                continue
            if pool.usable_count(name, until=until, strict_until=strict, is_lent=mode) < gpu_count:
                continue
            if gpu_count > pool.max_size(name):
                gpus = pool.find_multi(name, gpu_count, until=until, strict=strict, mode=mode)
                if gpus is None:
                    continue
                per_node: dict[int, int] = {}
                for gpu in gpus:
                    node = self._gpu_node[gpu]
                    per_node[node] = per_node.get(node, 0) + 1
                cost = sum(self.node_cost(node, count, until) for node, count in per_node.items())
                pins = sum(1 for node in per_node if self._pins(node, per_node[node]))
                key = (pins, cost_class(cost), rank, 0, 0, min(per_node))
                if best is None or key < best[0]:
                    best = (key, gpus)
                continue
            seen = 0
            # `_pins`, `node_cost` and `cost_class` written out: this is the inner loop of
            # berth's placement (up to MAX_CANDIDATES nodes for each start of a round)
            node_gpus, drain, now, pinned = self._node_gpus, self._drain, self._now, self._pinned
            is_lendable = self.is_lendable
            for node, usable in pool.candidates(name, gpu_count, until=until, strict=strict, mode=mode):
                usable_count = len(usable)
                if usable_count < gpu_count:
                    continue
                size = len(node_gpus[node])
                others = size - gpu_count
                pins = 0 if is_lendable or node in pinned or others <= 0 else 1
                cost_rank = 0
                if others > 0:
                    delay = until - drain.get(node, now)
                    if delay > 0 and delay * others > 0.0:
                        cost_rank = 1 + int(math.log2(1.0 + delay * others / 3_600.0))
                key = (pins, cost_rank, rank, usable_count - gpu_count, size, node)
                if best is None or key < best[0]:
                    best = (key, tuple(sorted(usable[:gpu_count])))
                    if pins == 0 and cost_rank == 0:
                        # candidates come tightest first and earlier types rank better: the
                        # first cost-free one is the best fit among the cost-free ones
                        return best[1]
                seen += 1
                if seen >= MAX_CANDIDATES:
                    break
        return None if best is None else best[1]

    def delays_drain(self, gpus: Sequence[int], until: float) -> bool:
        """Whether running on ``gpus`` until ``until`` delays some node's expected drain: such
        work takes capacity that wide jobs wait for, so berth starts it lent when it may be
        preempted (see `reclaim_for_wide`)."""
        per_node: dict[int, int] = {}
        for gpu in gpus:
            node = self._gpu_node[gpu]
            per_node[node] = per_node.get(node, 0) + 1
        return any(self.node_cost(node, count, until) > 0 for node, count in per_node.items())


def reclaim_for_wide(sched: Round, job: JobRequest, types: Sequence[str], estimate: Estimate) -> bool:
    """Berth: get a whole node for a blocked multi-GPU job by reclaiming lent work on it.

    Only work started lent (preemptible, on capacity that delayed a node's drain, see
    `DrainAwareChooser.delays_drain`) is taken, only once it is past its minimum runtime (the
    job waits only the grace), and only when the job gains more GPU-time than the victims lose:
    the free GPUs of the node would otherwise idle until the node's expected drain.  They would
    not idle while a smaller pending job could use them (`_smaller_job_fits`): then nothing is
    reclaimed and the backfill gets them.
    """
    chooser = sched.drain_chooser
    if chooser is None or job.gpu_count < 2 or not sched.is_single_node(types, job.gpu_count):
        return False
    state = sched.state
    now = sched.now
    pool = sched.pool_for(job)
    until = now + estimate.hold_s
    latest_kill = now + state.policy.grace_s
    reclaim = plan_reclaim(
        state,
        node_indexes=sched.nodes_for(job, types),
        gpu_count=job.gpu_count,
        free_on_node=lambda i: pool.node_usable(i, until=until, strict_until=until, is_lent=0),
        incoming={},
        excluded_jobs=sched.out.preempted,
        is_single_node=True,
        may_take=lambda running: kill_time(state, running) <= latest_kill,
    )
    if reclaim is None or not reclaim.victims:
        return False
    if _smaller_job_fits(sched, job, types, pool):
        return False
    node = state.gpu_node[reclaim.incoming_gpus[0]]
    gained = len(reclaim.free_gpus) * (chooser.drain_at(node) - reclaim.ready_at)
    lost = sum(victim.lost_gpu_s for victim in reclaim.victims)
    if gained <= lost:
        return False
    for victim in reclaim.victims:
        label = claim_label("job", job.id, same_owner=job.user == victim.running.job.user)
        sched.preempt(victim.running, for_id=job.id, why=f"{label}, which needs a whole node")
    pool.take(reclaim.free_gpus)
    for gpu in reclaim.free_gpus:
        sched.out.claimed[gpu] = job.id
    sched.round_promised.update(reclaim.incoming_gpus)
    sched.out.promised.update(reclaim.incoming_gpus)
    if sched.top is None:
        sched.top = job
    sched.out.wait(
        job.id,
        PendingReason.PREEMPTING,
        f"{len(reclaim.free_gpus)} of its {job.gpu_count} GPUs are free on one node and the rest run "
        f"lent work, which is being reclaimed ({len(reclaim.victims)} job(s) signalled now); "
        f"it starts in about {fmt_s(reclaim.ready_at - now)}.",
        reclaim.ready_at,
    )
    sched.out.wake_at(reclaim.ready_at, now)
    return True


def defers_wide_borrower(sched: Round, job: JobRequest, types: Sequence[str], wait_s: float) -> bool:
    """Berth: whether a wide batch job that would run on borrowed GPUs waits for guaranteed work.

    A job that needs several GPUs on one node and would borrow (its project has a quota that
    does not cover the job: it would run lent, `Admit.must_lend`) takes a whole node's worth
    of capacity nobody promised it, for a runtime the prediction often gets wrong by orders of
    magnitude (a pod of days predicted at a minute).  Borrowed capacity is capacity no
    guaranteed work wants: while a smaller pending batch job within its own project's
    guarantee could run on the free GPUs of the wide job's types (`_smaller_job_fits`), the
    wide job would take GPUs that job is owed and would be claimed back as soon as it started
    (a quota claim).  So it neither starts nor becomes the top job (no reservation, no drain,
    no reclaim) until it has waited ``wait_s`` since its first submission (berth: its
    starvation bound; it then heads the queue and gets the reservation like any starved job).
    Within a guarantee a job's claim stands; with no such smaller job waiting, it starts as
    before.

    Records the job's verdict and notes it in `Round.deferred_wide` when it waits.
    """
    if job.kind != JobKind.BATCH or job.gpu_count < 2 or not sched.is_single_node(types, job.gpu_count):
        return False
    first = job.first_submit_at if job.first_submit_at is not None else job.submit_at
    waited = sched.now - first
    if waited >= wait_s:
        return False
    # borrowing: its project has a quota of every type it may use and none covers it
    # (`Admit.must_lend`); without a quota there is nothing to borrow from
    if any((left := sched.guarantee_left(job.project, t)) is None or left >= job.gpu_count for t in types):
        return False
    pool = sched.pool_for(job)
    if not _smaller_job_fits(sched, job, types, pool, is_guaranteed_only=True):
        return False
    sched.deferred_wide.add(job.id)
    free = pool.free_in(types)
    together = pool.find(types, job.gpu_count, until=-math.inf, strict_until=-math.inf)
    if free >= job.gpu_count and together is None:
        # not together on one node either: what it would wait for anyway (and what the idle
        # GPUs of its types are counted as, `explain.idle_reasons`)
        sched.out.wait(
            job.id,
            PendingReason.FRAGMENTATION,
            f"{free} fitting GPUs are free in total, but no node has {job.gpu_count} of them together.",
        )
        return True
    sched.out.wait(
        job.id,
        PendingReason.PRIORITY,
        f"Needs {job.gpu_count} GPUs on one node beyond its project's guarantee (borrowed GPUs): it "
        f"waits while smaller jobs within their guarantees can use the free GPUs, at most "
        f"{fmt_s(wait_s - waited)} more.",
    )
    return True


def _smaller_job_fits(
    sched: Round, job: JobRequest, types: Sequence[str], pool: FreePool, *, is_guaranteed_only: bool = False
) -> bool:
    """Whether another pending batch job smaller than ``job`` (not started this round) could
    run on the free GPUs of ``pool`` among ``types``: enough free GPUs of the types it may use
    (its type, memory and precision constraints, `Round.types_for`); with
    ``is_guaranteed_only``, only a job within its project's guarantee on those types counts.

    The gain `reclaim_for_wide` weighs against the victims' loss is the free GPUs' idle time
    until the node drains; with such a job waiting they are not idle (the backfill starts it),
    so reclaiming would trade work already running for a wide start that gains no GPU-time,
    and under overload it fills whole nodes with wide work while small jobs queue (Alibaba 2 %
    x8, seeds 0-15: docs/benchmarks.md, "Alibaba short pods II").  A job whose constraints no
    free GPU of ``types`` meets does not use them, so it does not count.
    """
    free = pool.free_in(types)
    if free <= 0:
        return False
    started = {start.job_id for start in sched.out.starts}
    wide_types = set(types)
    for other in sched.state.snapshot.pending:
        if (
            other.kind != JobKind.BATCH
            or other.gpu_count > free
            or other.gpu_count >= job.gpu_count
            or other.id in started
        ):
            continue
        usable = [t for t in sched.types_for(other) if t in wide_types]
        if (
            usable
            and pool.free_in(usable) >= other.gpu_count
            and (not is_guaranteed_only or sched.is_within_guarantee(other, usable))
        ):
            return True
    return False
