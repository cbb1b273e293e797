"""Static's interactive partition, and the batch jobs wider than the rest of the cluster.

A site that carves an interactive partition out of its cluster still runs the jobs that need
more nodes than the batch partition has: in Slurm the interactive nodes are also in an
overlapping partition that such jobs are submitted to, and when one of them reaches the head of
the batch queue the admins drain the interactive nodes for it (a reservation on them from the
batch side's shadow time).  With ``Model.spans_wide_jobs`` the engine does the same:

* a batch job is *wide* when no set of up batch-side nodes of a fitting type could ever hold
  it (no batch node is big enough for a single-node gang, or the batch side has fewer GPUs
  than a multi-node gang needs);
* a wide job runs only as the head of the batch queue (never as backfill, `refuse_wide`): it
  starts when enough GPUs are free on both sides together (`SpanPool`), else it is the batch
  top job with an EASY reservation over all nodes;
* that reservation drains the interactive partition for it: sessions may still use the
  reserved GPUs only if they expect to end (on their requested time) before its shadow start,
  exactly as EASY backfill treats any lower-priority job.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from operator import is_
from typing import TYPE_CHECKING

from scheduling.engine.placement import FreePool, Hold, gang_from_nodes
from scheduling.engine.types import JobKind, JobRequest, PendingReason

if TYPE_CHECKING:
    from scheduling.engine.round import Round


class SpanPool:
    """The batch and the interactive pools seen as one, for a wide job (normal starts only)."""

    def __init__(self, batch: FreePool, inter: FreePool, inter_gpus: frozenset[int], rnd: Round) -> None:
        """Both sides' pools; ``inter_gpus``: the partition's GPUs."""
        self.batch = batch
        self.inter = inter
        self.inter_gpus = inter_gpus
        # a weak reference: the round holds this pool, and a cycle would leave every round's
        # objects to the cyclic collector (a replay plans hundreds of thousands of rounds)
        self.rnd = weakref.proxy(rnd)

    def free_count(self, gpu_type: str) -> int:
        """Free GPUs of a type on both sides."""
        return self.batch.free_count(gpu_type) + self.inter.free_count(gpu_type)

    def free_in(self, types: Sequence[str]) -> int:
        """Free GPUs of any of ``types`` on both sides."""
        return sum(self.free_count(t) for t in types)

    def hold_of(self, gpu: int) -> Hold | None:
        """The hold on a free GPU, from the side it is on."""
        return (self.inter if gpu in self.inter_gpus else self.batch).hold_of(gpu)

    def take(self, gpus: Iterable[int]) -> None:
        """Take GPUs from the side each is on."""
        chosen = list(gpus)
        self.batch.take(g for g in chosen if g not in self.inter_gpus)
        self.inter.take(g for g in chosen if g in self.inter_gpus)

    def hold(self, gpus: Iterable[int], hold: Hold) -> None:
        """Hold GPUs on both sides (each pool ignores GPUs that are not free in it)."""
        chosen = list(gpus)
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
        rnd = self.rnd
        if rnd.is_single_node(gpu_types, gpu_count):
            for pool in (self.batch, self.inter):
                found = pool.find(gpu_types, gpu_count, until=until, strict_until=strict)
                if found is not None:
                    return found
            return None
        per_node: list[tuple[int, int, list[int]]] = []
        for i in self._all_nodes(gpu_types):
            pool = self.inter if i in rnd.partition_nodes else self.batch
            usable = pool.node_usable(i, until=until, strict_until=strict, is_lent=0)
            if usable:
                per_node.append((-len(usable), i, usable))
        for name in gpu_types:  # a gang stays on one GPU type
            nodes = sorted(n for n in per_node if rnd.state.nodes[n[1]].gpu_type == name)
            if -sum(n[0] for n in nodes) < gpu_count:
                continue
            found = gang_from_nodes(nodes, gpu_count)
            if found is not None:
                return found
        return None

    def _all_nodes(self, gpu_types: Sequence[str]) -> Iterator[int]:
        wanted = set(gpu_types)
        nodes = self.rnd.state.nodes
        return (i for i in self.rnd.schedulable if nodes[i].gpu_type in wanted)


def _is_wider_than_batch(rnd: Round, job: JobRequest) -> bool:
    types = rnd.types_for(job)
    if not types:
        return False
    # the batch side's node sizes per type set depend on the nodes and the partition alone:
    # kept on the (shared) topology, so a long queue does not rescan every node per job
    derived = rnd.state.topology.derived
    key = ("batch_sizes", tuple(types), rnd.partition_nodes)
    found = derived.get(key)
    if found is None:
        nodes = rnd.state.nodes
        sizes = [
            len(nodes[i].gpu_ids)
            for i in rnd.schedulable
            if i not in rnd.partition_nodes and nodes[i].gpu_type in types
        ]
        found = derived[key] = (max(sizes, default=0), sum(sizes))
    largest, total = found
    if rnd.is_single_node(types, job.gpu_count):
        return largest < job.gpu_count
    return total < job.gpu_count


def open_span(rnd: Round) -> None:
    """Build the span pool and find the wide batch jobs of the round (module docstring)."""
    rnd.span_pool = SpanPool(rnd.batch_pool, rnd.inter_pool, rnd.partition_gpus, rnd)
    if rnd.partition_nodes:
        # the answer depends on the job's constraints and size, the nodes and the partition
        # alone: kept per shape on the (shared) topology, so a long queue costs a lookup per job
        derived = rnd.state.topology.derived
        key = ("wide_shapes", rnd.partition_nodes)
        memo = derived.get(key)
        if memo is None:
            memo = derived[key] = {}
        # an unconstrained job may use every type (`Round.types_for`): its answer depends on
        # its size alone, looked up without building its shape
        by_size = derived.get(("wide_sizes", rnd.partition_nodes))
        if by_size is None:
            by_size = derived[("wide_sizes", rnd.partition_nodes)] = {}
        batch = JobKind.BATCH
        pending = rnd.state.snapshot.pending
        # the last round's pending jobs and their wide ids: a replay's queue keeps its order
        # (ends and arrivals leave it as it was or add jobs behind it), and a job (immutable)
        # that comes back as the very same object is as wide as it was
        last_key = ("wide_last", rnd.partition_nodes)
        last = derived.get(last_key)
        done = 0
        wide: list[str] = []
        if last is not None and len(last[0]) <= len(pending) and all(map(is_, last[0], pending)):
            done, wide = len(last[0]), list(last[1])
            if done == len(pending):
                rnd.wide = last[2]
                return
        for job in pending[done:] if done else pending:
            if job.kind != batch:
                continue
            if job.gpu_type is None and not job.precisions and job.min_memory_gib <= 0:
                is_wide = by_size.get(job.gpu_count)
                if is_wide is None:
                    is_wide = by_size[job.gpu_count] = _is_wider_than_batch(rnd, job)
            else:
                shape = (job.gpu_type, job.min_memory_gib, job.precisions, job.gpu_count)
                is_wide = memo.get(shape)
                if is_wide is None:
                    is_wide = memo[shape] = _is_wider_than_batch(rnd, job)
            if is_wide:
                wide.append(job.id)
        rnd.wide = frozenset(wide)
        derived[last_key] = (pending, wide, rnd.wide)


def refuse_wide(rnd: Round, job: JobRequest) -> None:
    """A wide job behind the batch top job waits: it runs only as the head of the batch queue."""
    top = rnd.top
    assert top is not None
    rnd.out.wait(job.id, PendingReason.PRIORITY, wide_sentence(job, top))


def wide_sentence(job: JobRequest, top: JobRequest) -> str:
    """`refuse_wide`'s sentence for ``job`` behind the batch top job ``top``."""
    return (
        f"Needs {job.gpu_count} GPUs, more than the batch partition has; it runs across the "
        f"interactive partition once it is first in the batch queue (top job now: {top.id})."
    )
