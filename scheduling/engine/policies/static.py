"""``static``: a fixed interactive partition (sized for peak) plus ``easy`` on the rest.

Interactive sessions and bookings only go to ``policy.interactive_partition`` nodes; batch
runs on the other nodes.  Each side runs its own EASY pass with its own top-job reservation.

Jobs wider than the batch partition.  A site that carves an interactive partition out of its
cluster still runs the jobs that need more nodes than the batch partition has: in Slurm the
interactive nodes are also in an overlapping partition that such jobs are submitted to, and
when one of them reaches the head of the batch queue the admins drain the interactive nodes
for it (a reservation on them from the batch side's shadow time).  ``static`` does the same:

* a batch job is *wide* when no set of up batch-side nodes of a fitting type could ever hold
  it (no batch node is big enough for a single-node gang, or the batch side has fewer GPUs
  than a multi-node gang needs);
* a wide job runs only as the head of the batch queue (never as backfill): it starts when
  enough GPUs are free on both sides together, else it is the batch top job with an EASY
  reservation over all nodes;
* that reservation drains the interactive partition for it: sessions may still use the
  reserved GPUs only if they expect to end (on their requested time) before its shadow start,
  exactly as EASY backfill treats any lower-priority job.  Sessions lose priority over a wide
  job only on the GPUs it reserves; every other partition GPU stays theirs.

Because the wide job's reservation must be in place before sessions are placed, the batch pass
runs first; the two sides use disjoint GPUs otherwise, so the order changes nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from scheduling.engine.cluster import Estimate
from scheduling.engine.explain import build_plan
from scheduling.engine.placement import FreePool, Hold, gang_from_nodes
from scheduling.engine.priority import priority_order
from scheduling.engine.scheduler import Knobs, Scheduler
from scheduling.engine.types import ClusterSnapshot, JobKind, JobRequest, PendingReason, Plan, PolicyConfig

STATIC = Knobs(has_partition=True)


class _SpanPool:
    """The batch and the interactive pools seen as one, for a wide job (normal starts only)."""

    def __init__(
        self, batch: FreePool, inter: FreePool, inter_gpus: frozenset[int], sched: Scheduler
    ) -> None:
        self.batch = batch
        self.inter = inter
        self.inter_gpus = inter_gpus
        self.sched = sched

    def free_count(self, gpu_type: str) -> int:
        return self.batch.free_count(gpu_type) + self.inter.free_count(gpu_type)

    def hold_of(self, gpu: int) -> Hold | None:
        return (self.inter if gpu in self.inter_gpus else self.batch).hold_of(gpu)

    def take(self, gpus: Iterable[int]) -> None:
        chosen = list(gpus)
        self.batch.take(g for g in chosen if g not in self.inter_gpus)
        self.inter.take(g for g in chosen if g in self.inter_gpus)

    def hold(self, gpus: Iterable[int], hold: Hold) -> None:
        chosen = list(gpus)  # each pool ignores GPUs that are not free in it
        self.batch.hold(chosen, hold)
        self.inter.hold(chosen, hold)

    def find(
        self,
        gpu_types: Sequence[str],
        gpu_count: int,
        *,
        until: float,
        strict_until: float | None = None,
        **_ignored: object,
    ) -> tuple[int, ...] | None:
        """GPUs for a wide job over both sides: whole nodes first (largest first), then the
        node that tops up most tightly, like a multi-node gang in `FreePool.find`."""
        strict = until if strict_until is None else strict_until
        sched = self.sched
        if sched.is_single_node(gpu_types, gpu_count):
            for pool in (self.batch, self.inter):
                found = pool.find(gpu_types, gpu_count, until=until, strict_until=strict)
                if found is not None:
                    return found
            return None
        per_node: list[tuple[int, int, list[int]]] = []
        for i in self._all_nodes(gpu_types):
            pool = self.inter if i in sched.partition_nodes else self.batch
            usable = pool.node_usable(i, until=until, strict_until=strict, is_lent=0)
            if usable:
                per_node.append((-len(usable), i, usable))
        for name in gpu_types:  # a gang stays on one GPU type
            nodes = sorted(n for n in per_node if sched.state.nodes[n[1]].gpu_type == name)
            if -sum(n[0] for n in nodes) < gpu_count:
                continue
            found = gang_from_nodes(nodes, gpu_count)
            if found is not None:
                return found
        return None

    def _all_nodes(self, gpu_types: Sequence[str]) -> Iterator[int]:
        wanted = set(gpu_types)
        nodes = self.sched.state.nodes
        return (i for i in self.sched.schedulable if nodes[i].gpu_type in wanted)


class _StaticScheduler(Scheduler):
    """`Scheduler` with the wide-job rule of the module docstring."""

    def __init__(self, snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> None:
        super().__init__(snapshot, policy, now, STATIC)
        nodes = self.state.nodes
        inter_gpus = frozenset(g for i in self.partition_nodes for g in nodes[i].gpu_ids)
        self.span_pool = _SpanPool(self.batch_pool, self.inter_pool, inter_gpus, self)
        self.wide: frozenset[str] = frozenset()
        self._span_nodes: dict[tuple[str, ...], tuple[tuple[int, tuple[int, ...]], ...]] = {}
        if self.partition_nodes:
            self.wide = frozenset(
                job.id
                for job in snapshot.pending
                if job.kind == JobKind.BATCH and self._is_wider_than_batch(job)
            )

    def _is_wider_than_batch(self, job: JobRequest) -> bool:
        types = self.types_for(job)
        if not types:
            return False
        nodes = self.state.nodes
        batch = [
            len(nodes[i].gpu_ids)
            for i in self.schedulable
            if i not in self.partition_nodes and nodes[i].gpu_type in types
        ]
        if self.is_single_node(types, job.gpu_count):
            return all(size < job.gpu_count for size in batch)
        return sum(batch) < job.gpu_count

    def node_gpus_for(
        self, job: JobRequest | None, types: Sequence[str]
    ) -> tuple[tuple[int, tuple[int, ...]], ...]:
        # `nodes_for` reads this too: a wide job may use the nodes of both partitions
        if job is None or job.id not in self.wide:
            return super().node_gpus_for(job, types)
        key = tuple(types)
        found = self._span_nodes.get(key)
        if found is None:
            wanted = set(types)
            nodes = self.state.nodes
            found = self._span_nodes[key] = tuple(
                (i, nodes[i].gpu_ids) for i in self.schedulable if nodes[i].gpu_type in wanted
            )
        return found

    def pool_for(self, job: JobRequest) -> FreePool:
        if job.id in self.wide:
            return self.span_pool  # type: ignore[return-value]  # duck-typed FreePool
        return super().pool_for(job)

    def try_start(self, job: JobRequest, types: Sequence[str], estimate: Estimate) -> bool:
        if job.id in self.wide and self.top is not None:
            self.out.wait(
                job.id,
                PendingReason.PRIORITY,
                f"Needs {job.gpu_count} GPUs, more than the batch partition has; it runs across the "
                f"interactive partition once it is first in the batch queue (top job now: {self.top.id}).",
            )
            return False
        return super().try_start(job, types, estimate)


def plan_static(snapshot: ClusterSnapshot, policy: PolicyConfig, now: float) -> Plan:
    """EASY on the batch nodes and, separately, on the interactive partition."""
    sched = _StaticScheduler(snapshot, policy, now)
    queue = priority_order(sched.state)
    interactive = [job for job in queue if job.kind == JobKind.INTERACTIVE]
    batch = [job for job in queue if job.kind != JobKind.INTERACTIVE]
    sched.easy_pass(batch, interactive_first=False)
    batch_top = (sched.top, sched.top_shadow, sched.top_fragmented)
    # each side has its own top job: the batch one must not block the partition's pass
    sched.top = None
    sched.top_shadow = None
    sched.top_fragmented = False
    sched.easy_pass(interactive, interactive_first=False)
    sched.top, sched.top_shadow, sched.top_fragmented = batch_top
    return build_plan(sched, queue)
