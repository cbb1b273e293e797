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
* costs are compared in factor-of-two classes (runtime predictions are rarely better than
  that), then by the policy's type preference (cheap types first), then best fit (fewest GPUs
  left on the node), then smaller nodes, then the node index for determinism.

So short work goes to nodes pinned by long work, an empty large node is not broken while a
partly used node takes the job at no greater cost, and the node closest to draining is
steered clear of work that would outlive it.  Nothing here preempts anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scheduling.engine.cluster import RoundState, running_ends
from scheduling.engine.placement import FreePool
from scheduling.engine.types import Booking

# Per query, at most this many nodes of a type are scored (tightest fits first, see
# `FreePool.candidates`): it bounds a round's placement cost on large clusters, and the nodes
# left out are the emptiest ones, which are also the costliest to break.
MAX_CANDIDATES = 64

_CostKey = tuple[int, int, int, int, int]


def cost_class(cost_gpu_s: float) -> int:
    """0 for no cost, else 1 + floor(log2(1 + GPU-hours)): factor-of-two classes."""
    if cost_gpu_s <= 0.0:
        return 0
    return 1 + int(math.log2(1.0 + cost_gpu_s / 3_600.0))


class DrainAwareChooser:
    """The `placement.NodeChooser` of berth (see the module docstring)."""

    __slots__ = ("_drain", "_gpu_node", "_node_gpus", "_now", "_started_end")

    def __init__(
        self,
        state: RoundState,
        started_end: Mapping[int, tuple[float, float]],
        active_bookings: Mapping[int, Booking],
    ) -> None:
        """``started_end`` (GPU -> (p50 end, hold end) of jobs started this round) is read live,
        so drain times follow the round's own starts."""
        self._now = now = state.now
        self._gpu_node = state.gpu_node
        self._node_gpus = [node.gpu_ids for node in state.nodes]
        self._started_end = started_end
        drain: dict[int, float] = {}
        policy = state.policy
        for running in state.snapshot.running:
            if running.grace_until is not None:
                end = max(running.grace_until, now)
            else:
                end = running_ends(running, now, policy, is_predicted=True)[0]
            for gpu in running.gpu_ids:
                node = self._gpu_node.get(gpu)
                if node is not None and drain.get(node, now) < end:
                    drain[node] = end
        for gpu, booking in active_bookings.items():
            node = self._gpu_node.get(gpu)
            if node is not None and drain.get(node, now) < booking.end_at:
                drain[node] = booking.end_at
        self._drain = drain

    def drain_at(self, node: int) -> float:
        """When the node is expected to have no work left (``now`` if it has none)."""
        at = self._drain.get(node, self._now)
        started = self._started_end
        if started:
            for gpu in self._node_gpus[node]:
                end = started.get(gpu)
                if end is not None and end[0] > at:
                    at = end[0]
        return at

    def node_cost(self, node: int, gpu_count: int, until: float) -> float:
        """GPU-seconds of whole-node capacity lost by running ``gpu_count`` GPUs there until ``until``."""
        others = len(self._node_gpus[node]) - gpu_count
        if others <= 0:
            return 0.0
        delay = until - self.drain_at(node)
        return delay * others if delay > 0 else 0.0

    def choose(
        self, pool: FreePool, gpu_types: Sequence[str], gpu_count: int, *, until: float, strict: float, mode: int
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
                key = (cost_class(cost), rank, 0, 0, min(per_node))
                if best is None or key < best[0]:
                    best = (key, gpus)
                continue
            seen = 0
            for node, usable in pool.candidates(name, gpu_count, until=until, strict=strict, mode=mode):
                if len(usable) < gpu_count:
                    continue
                size = len(self._node_gpus[node])
                key = (
                    cost_class(self.node_cost(node, gpu_count, until)),
                    rank,
                    len(usable) - gpu_count,
                    size,
                    node,
                )
                if best is None or key < best[0]:
                    best = (key, tuple(sorted(usable[:gpu_count])))
                seen += 1
                if seen >= MAX_CANDIDATES:
                    break
        return None if best is None else best[1]
