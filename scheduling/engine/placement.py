"""Where a job's GPUs go: type/memory/precision-aware, node-bounded, all-or-nothing, best fit.

`FreePool` is the per-round index of free GPUs.  It is mutable on purpose (one round, one
owner, never shared) so placement is O(node sizes + held nodes) instead of O(nodes) per query:

* free GPUs are bucketed by node and by how many *plain* (unheld) free GPUs a node has, so the
  best-fit node for a k-GPU job is the first non-empty bucket >= k;
* GPUs *held* for something later (a booking, the top job's reservation, interactive headroom)
  stay in the pool with a `Hold`, and a query may use them only if it leaves them in time.

A job of at most one node's GPUs goes on one node (gangs never straddle a node when they fit in
one); a bigger job takes whole nodes first and tops up on the best-fitting node.  All GPUs of a
job are of one type.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduling.engine.types import GpuType, JobRequest

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs free now but promised to something later.

    ``normal_until``: a non-preemptible start may use the GPU if it expects to end by then.
    ``lent_until``: a preemptible (lent) start may use it if it can be evicted by then.
    ``is_strict``: a promise to a person (booking): non-preemptible starts are checked against
    their hard limit (``strict_until``) rather than a prediction.
    """

    holder: str
    normal_until: float
    lent_until: float
    is_strict: bool = False
    is_checkpoint_only: bool = False  # lent starts only for checkpointing work
    is_for_interactive: bool = False  # interactive headroom: sessions may always use it
    # with ``is_checkpoint_only``: restartable lent work may still use the GPU if it expects to
    # be off it by then (the interactive pool's next demand rise)
    restart_until: float = -INF

    def merge(self, other: Hold) -> Hold:
        """The stricter of two holds on one GPU (the earlier holder names it)."""
        first = self if self.normal_until <= other.normal_until else other
        return Hold(
            holder=first.holder,
            normal_until=min(self.normal_until, other.normal_until),
            lent_until=min(self.lent_until, other.lent_until),
            is_strict=self.is_strict or other.is_strict,
            is_checkpoint_only=self.is_checkpoint_only or other.is_checkpoint_only,
            is_for_interactive=self.is_for_interactive and other.is_for_interactive,
            restart_until=min(self.restart_until, other.restart_until),
        )


ConstraintKey = tuple[str | None, float, frozenset[str]]


def constraint_key(job: JobRequest) -> ConstraintKey:
    """The part of a job that decides which GPU types it may use."""
    return (job.gpu_type, job.min_memory_gib, job.precisions)


def type_satisfies(gpu_type: GpuType, key: ConstraintKey) -> bool:
    """Whether one GPU type meets a job's type, memory and precision constraints."""
    name, min_memory_gib, precisions = key
    if name is not None and gpu_type.name != name:
        return False
    if gpu_type.memory_gib < min_memory_gib:
        return False
    return precisions <= gpu_type.precisions


class NodeChooser(Protocol):
    """A policy's own node choice (see ``fragmentation.py``); `FreePool.find` defers to it."""

    def choose(
        self,
        pool: FreePool,
        gpu_types: Sequence[str],
        gpu_count: int,
        *,
        until: float,
        strict: float,
        mode: int,
    ) -> tuple[int, ...] | None: ...


class FreePool:
    """Free GPUs of one round, indexed for best-fit queries (see the module docstring)."""

    __slots__ = (
        "_buckets",
        "_chooser",
        "_free",
        "_gpu_node",
        "_groups",
        "_held",
        "_held_nodes",
        "_max_size",
        "_memo",
        "_node_type",
        "_nonempty",
        "_plain",
        "_type_free",
        "_type_plain",
        "holds",
        "takes",
    )

    def __init__(
        self,
        free_gpus: Iterable[int],
        *,
        gpu_node: dict[int, int],
        node_types: list[str],
        max_size: dict[str, int],
        chooser: NodeChooser | None = None,
    ) -> None:
        """Index ``free_gpus``; ``gpu_node`` maps a GPU to its node index, ``node_types`` a node
        index to its GPU type, ``max_size`` a type to its largest node (see `Topology`);
        ``chooser`` replaces the plain best fit of `find`."""
        self._chooser = chooser
        self._node_type = node_types
        self._gpu_node = gpu_node
        self._max_size = max_size
        self._free: dict[int, list[int]] = {}
        free = self._free
        for gpu in sorted(free_gpus):
            node_gpus = free.get(gpu_node[gpu])
            if node_gpus is None:
                free[gpu_node[gpu]] = [gpu]
            else:
                node_gpus.append(gpu)
        # results of `find` since the pool last changed: explanations ask the same question
        # (e.g. "could it fit ignoring holds") for many jobs of a round
        self._memo: dict[tuple[tuple[str, ...], int, float, float, int, bool], tuple[int, ...] | None] = {}
        self._held: dict[int, Hold] = {}
        # per type: hold -> its free GPUs, so "how many GPUs may this query use" is O(holds)
        self._groups: dict[str, dict[Hold, set[int]]] = {name: {} for name in self._max_size}
        self._plain: dict[int, int] = {}
        self._buckets: dict[str, list[set[int]]] = {
            name: [set() for _ in range(size + 1)] for name, size in self._max_size.items()
        }
        self._held_nodes: dict[str, set[int]] = {name: set() for name in self._max_size}
        self._nonempty: dict[str, set[int]] = {name: set() for name in self._max_size}
        type_free: dict[str, int] = dict.fromkeys(self._max_size, 0)
        plain, buckets, nonempty = self._plain, self._buckets, self._nonempty
        for node_index, gpus in free.items():
            name = node_types[node_index]
            count = len(gpus)
            plain[node_index] = count
            buckets[name][count].add(node_index)
            nonempty[name].add(node_index)
            type_free[name] += count
        self._type_free = type_free
        self._type_plain: dict[str, int] = dict(type_free)
        # how many times `take` and `hold` changed the pool (memos of a round key on them)
        self.takes = 0
        self.holds = 0

    # ---- reads ----

    def free_count(self, gpu_type: str) -> int:
        """Free GPUs of a type, held ones included."""
        return self._type_free.get(gpu_type, 0)

    def free_in(self, types: Sequence[str]) -> int:
        """Free GPUs of any of ``types``, held ones included (one type: `free_count`)."""
        type_free = self._type_free
        if len(types) == 1:
            return type_free.get(types[0], 0)
        return sum(type_free.get(t, 0) for t in types)

    def free_counts(self) -> dict[str, int]:
        """Free GPUs per type, held ones included, as they are now (a copy)."""
        return dict(self._type_free)

    def free_total(self) -> int:
        """Free GPUs of every type, held ones included: no `free_in` is larger."""
        return sum(self._type_free.values())

    def hold_of(self, gpu: int) -> Hold | None:
        return self._held.get(gpu)

    def held_gpus(self) -> list[int]:
        return list(self._held)

    def free_gpus(self) -> list[int]:
        """Every free GPU, sorted."""
        return sorted(gpu for gpus in self._free.values() for gpu in gpus)

    def nodes_with_free(self) -> Collection[int]:
        """The nodes with a free GPU (held or not); `node_usable` is empty on every other node."""
        return self._free.keys()

    def max_size(self, gpu_type: str) -> int:
        return self._max_size.get(gpu_type, 0)

    def candidates(
        self, name: str, gpu_count: int, *, until: float, strict: float, mode: int
    ) -> Iterator[tuple[int, list[int]]]:
        """Nodes of a type with at least ``gpu_count`` usable GPUs, tightest plain fit first, then
        nodes whose GPUs are partly held; yields (node, its usable GPUs)."""
        seen: set[int] = set()
        for bucket in self._buckets[name][gpu_count:]:
            for node in bucket:
                seen.add(node)
                yield node, self.node_usable(node, until=until, strict_until=strict, is_lent=mode)
        for node in self._held_nodes[name]:
            if node not in seen:
                usable = self.node_usable(node, until=until, strict_until=strict, is_lent=mode)
                if len(usable) >= gpu_count:
                    yield node, usable

    def find_multi(
        self, name: str, gpu_count: int, *, until: float, strict: float, mode: int
    ) -> tuple[int, ...] | None:
        """A gang bigger than any node of the type (the plain whole-nodes-first choice)."""
        found = self._find_multi(name, gpu_count, until, strict, mode)
        return None if found is None else found[1]

    # ---- writes ----

    def take(self, gpus: Iterable[int]) -> None:
        """Remove GPUs from the pool (they were started on, claimed or set aside)."""
        self._memo.clear()
        self.takes += 1
        for gpu in gpus:
            node = self._gpu_node[gpu]
            free = self._free[node]
            free.remove(gpu)
            name = self._node_type[node]
            self._type_free[name] -= 1
            hold = self._held.pop(gpu, None)
            if hold is not None:
                group = self._groups[name][hold]
                group.discard(gpu)
                if not group:
                    del self._groups[name][hold]
                if not any(g in self._held for g in free):
                    self._held_nodes[name].discard(node)
            else:
                self._type_plain[name] -= 1
                self._move(node, name, self._plain[node] - 1)
            if not free:
                del self._free[node]
                self._nonempty[name].discard(node)

    def hold(self, gpus: Iterable[int], hold: Hold) -> None:
        """Put a hold on free GPUs (non-free ones are ignored); holds on one GPU merge."""
        self._memo.clear()
        self.holds += 1
        free, held, gpu_node, node_types = self._free, self._held, self._gpu_node, self._node_type
        # the group of GPUs under ``hold`` itself, per type (looked up once: hashing a Hold is not free)
        own_group: dict[str, set[int]] = {}
        # id(previous hold) -> previous.merge(hold): the GPUs of one earlier holder merge alike
        # (the previous holds stay referenced by their other GPUs or by ``merges`` itself)
        merges: dict[int, tuple[Hold, Hold]] = {}
        for gpu in gpus:
            node = gpu_node.get(gpu)
            if node is None:
                continue
            node_free = free.get(node)
            if node_free is None or gpu not in node_free:
                continue
            name = node_types[node]
            previous = held.get(gpu)
            if previous is None:
                self._type_plain[name] -= 1
                self._move(node, name, self._plain[node] - 1)
                self._held_nodes[name].add(node)
                group = own_group.get(name)
                if group is None:
                    group = own_group[name] = self._groups[name].setdefault(hold, set())
                group.add(gpu)
                held[gpu] = hold
            else:
                own_group.pop(name, None)  # the merge below may drop or replace that group
                groups = self._groups[name]
                known = merges.get(id(previous))
                if known is None:
                    merged = previous.merge(hold)
                    merges[id(previous)] = (previous, merged)
                else:
                    merged = known[1]
                group = groups[previous]
                group.discard(gpu)
                if not group:
                    del groups[previous]
                held[gpu] = merged
                groups.setdefault(merged, set()).add(gpu)

    def hold_each(self, holds: Iterable[tuple[int, Hold]]) -> None:
        """`hold` ([gpu], hold) for each pair in order, as one change of the pool (non-free GPUs
        are ignored): the pool ends as after those calls, and a caller holding many GPUs under
        many holds (bookings, every round) saves the per-call work."""
        self._memo.clear()
        self.holds += 1
        free, held, gpu_node, node_types = self._free, self._held, self._gpu_node, self._node_type
        type_plain, plain, buckets_of, held_nodes = (
            self._type_plain,
            self._plain,
            self._buckets,
            self._held_nodes,
        )
        # id(hold) -> (type, its group): hashing a Hold is not free (each hold is alive in ``holds``)
        own_group: dict[int, tuple[str, set[int]]] = {}
        for gpu, hold in holds:
            node = gpu_node.get(gpu)
            if node is None:
                continue
            node_free = free.get(node)
            if node_free is None or gpu not in node_free:
                continue
            if gpu in held:
                own_group.clear()  # the merge may drop or replace a group
                self.hold((gpu,), hold)
                continue
            name = node_types[node]
            type_plain[name] -= 1
            # `_move` to one plain GPU fewer
            buckets = buckets_of[name]
            count = plain[node]
            buckets[count].discard(node)
            plain[node] = count - 1
            if count > 1:
                buckets[count - 1].add(node)
            held_nodes[name].add(node)
            found = own_group.get(id(hold))
            if found is None or found[0] != name:
                found = own_group[id(hold)] = (name, self._groups[name].setdefault(hold, set()))
            found[1].add(gpu)
            held[gpu] = hold

    def _move(self, node: int, name: str, count: int) -> None:
        buckets = self._buckets[name]
        buckets[self._plain[node]].discard(node)
        self._plain[node] = count
        if count > 0:
            buckets[count].add(node)

    # ---- queries ----

    @staticmethod
    def _hold_allows(hold: Hold, until: float, strict_until: float, is_lent: int) -> bool:
        # is_lent: 0 normal start, 1 lent, 2 lent and checkpointing, 3 interactive session
        if is_lent == 1 or is_lent == 2:
            if until <= hold.lent_until and (is_lent == 2 or not hold.is_checkpoint_only):
                return True
            return is_lent == 1 and until <= hold.restart_until
        if is_lent == 3 and hold.is_for_interactive:
            return True
        return (strict_until if hold.is_strict else until) <= hold.normal_until

    def usable_count(self, gpu_type: str, *, until: float, strict_until: float, is_lent: int) -> int:
        """How many free GPUs of a type a query may use, across nodes."""
        count = self._type_plain.get(gpu_type, 0)
        for hold, gpus in self._groups.get(gpu_type, {}).items():
            if self._hold_allows(hold, until, strict_until, is_lent):
                count += len(gpus)
        return count

    def node_usable(self, node: int, *, until: float, strict_until: float, is_lent: int) -> list[int]:
        """Usable free GPUs of a node: plain ones first, then held ones that are released in time."""
        free = self._free.get(node, ())
        held_map = self._held
        if not held_map or self._plain.get(node, 0) == len(free):
            return list(free)
        plain = [g for g in free if g not in held_map]
        held = [
            g for g in free if g in held_map and self._hold_allows(held_map[g], until, strict_until, is_lent)
        ]
        return plain + held

    def pick_fragments(self, gpu_types: Sequence[str], count: int) -> list[int]:
        """Up to ``count`` plain free GPUs from the nodes with the fewest free GPUs.

        Used to set GPUs aside (interactive headroom) where they hurt big gangs least.
        """
        chosen: list[int] = []
        for name in gpu_types:
            buckets = self._buckets.get(name)
            if buckets is None:
                continue
            for bucket in buckets[1:]:
                for node in sorted(bucket):
                    for gpu in self._free[node]:
                        if gpu not in self._held:
                            chosen.append(gpu)
                            if len(chosen) >= count:
                                return chosen
        return chosen

    def find(
        self,
        gpu_types: Sequence[str],
        gpu_count: int,
        *,
        until: float,
        strict_until: float | None = None,
        is_lent: bool = False,
        is_checkpointing: bool = False,
        is_interactive: bool = False,
        prefer_type_order: bool = False,
    ) -> tuple[int, ...] | None:
        """GPUs for a job, or None; does not take them.

        ``gpu_types`` are the eligible types in preference order.  With ``prefer_type_order``
        the first type that fits wins (keep scarce types for jobs that need them); otherwise
        the tightest fit over all types wins, ties broken by that order.  ``until`` is when the
        job expects to be off the GPUs (for lent starts: when it can be evicted);
        ``strict_until`` (default ``until``) is checked against bookings' strict holds.
        """
        strict = until if strict_until is None else strict_until
        mode = (2 if is_checkpointing else 1) if is_lent else (3 if is_interactive else 0)
        # the chooser's answer depends on more than the pool (drain times, pinning): not memoised
        if self._chooser is not None:
            return self._chooser.choose(self, gpu_types, gpu_count, until=until, strict=strict, mode=mode)
        key = (tuple(gpu_types), gpu_count, until, strict, mode, prefer_type_order)
        if key in self._memo:
            return self._memo[key]
        found = self._find(gpu_types, gpu_count, until, strict, mode, prefer_type_order)
        self._memo[key] = found
        return found

    def _find(
        self,
        gpu_types: Sequence[str],
        gpu_count: int,
        until: float,
        strict: float,
        mode: int,
        prefer_type_order: bool,
    ) -> tuple[int, ...] | None:
        best: tuple[int, int, tuple[int, ...]] | None = None  # (leftover, rank, gpus)
        for rank, name in enumerate(gpu_types):
            if self._type_free.get(name, 0) < gpu_count:
                continue
            if self.usable_count(name, until=until, strict_until=strict, is_lent=mode) < gpu_count:
                continue
            if gpu_count <= self._max_size[name]:
                found = self._find_single(name, gpu_count, until, strict, mode)
            else:
                found = self._find_multi(name, gpu_count, until, strict, mode)
            if found is None:
                continue
            leftover, gpus = found
            if prefer_type_order:
                return gpus
            if best is None or leftover < best[0]:
                best = (leftover, rank, gpus)
                if leftover == 0:
                    break
        return None if best is None else best[2]

    def _find_single(
        self, name: str, gpu_count: int, until: float, strict: float, is_lent: int
    ) -> tuple[int, tuple[int, ...]] | None:
        best_node = -1
        best_count = 0
        buckets = self._buckets[name]
        for count in range(gpu_count, len(buckets)):
            bucket = buckets[count]
            if bucket:
                best_node = next(iter(bucket))
                best_count = count
                break
        for node in self._held_nodes[name]:
            plain = self._plain[node]
            if best_node >= 0 and plain >= best_count:
                continue  # cannot fit tighter than the plain best
            usable = self.node_usable(node, until=until, strict_until=strict, is_lent=is_lent)
            if len(usable) >= gpu_count and (
                best_node < 0 or len(usable) < best_count or (len(usable) == best_count and node < best_node)
            ):
                best_node = node
                best_count = len(usable)
        if best_node < 0:
            return None
        usable = self.node_usable(best_node, until=until, strict_until=strict, is_lent=is_lent)
        return best_count - gpu_count, tuple(sorted(usable[:gpu_count]))

    def _find_multi(
        self, name: str, gpu_count: int, until: float, strict: float, is_lent: int
    ) -> tuple[int, tuple[int, ...]] | None:
        # the caller checked usable_count >= gpu_count, so a multi-node gang always fits
        per_node: list[tuple[int, int, list[int]]] = []
        held_nodes = self._held_nodes[name]
        free = self._free
        held_map = self._held
        # held GPUs this query may use: decided once per hold, not once per GPU
        allowed: set[int] = set()
        for hold, held_gpus in self._groups.get(name, {}).items():
            if self._hold_allows(hold, until, strict, is_lent):
                allowed.update(held_gpus)
        for node in self._nonempty[name]:
            gpus = free[node]
            if node in held_nodes:
                # as `node_usable`: plain GPUs first, then held ones released in time
                usable = [g for g in gpus if g not in held_map]
                usable += [g for g in gpus if g in allowed]
                if usable:
                    per_node.append((-len(usable), node, usable))
            else:  # no hold on the node: all its free GPUs (read only below)
                per_node.append((-len(gpus), node, gpus))
        per_node.sort()
        found = gang_from_nodes(per_node, gpu_count)
        return None if found is None else (0, found)


def gang_from_nodes(
    per_node: Sequence[tuple[int, int, Sequence[int]]], gpu_count: int
) -> tuple[int, ...] | None:
    """A multi-node gang from ``(-usable count, node, usable GPUs)`` entries sorted ascending.

    Whole nodes first, largest first, so big gangs span as few nodes as possible; then a top-up
    on the node that fits the remainder most tightly.  None when the nodes do not add up.
    """
    chosen: list[int] = []
    remaining = gpu_count
    rest: list[tuple[int, int, Sequence[int]]] = []
    for negative, node, usable in per_node:
        if -negative <= remaining:
            chosen.extend(usable)
            remaining += negative
        else:
            rest.append((-negative, node, usable))
        if remaining == 0:
            break
    if remaining > 0:
        rest.sort()
        for _size, _node, usable in rest:
            if len(usable) >= remaining:
                chosen.extend(usable[:remaining])
                remaining = 0
                break
    return tuple(sorted(chosen)) if remaining == 0 else None
