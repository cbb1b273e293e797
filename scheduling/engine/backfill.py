"""Availability profile and EASY shadow time.

The profile answers "when could this job start, and on which GPUs" from the expected end of
every running job (the policy's runtime model), GPUs being reclaimed, starts planned this round
and booking windows.  EASY reserves the earliest such start for the top job only; backfill may
use a reserved GPU only if it leaves it by the shadow time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

INF = float("inf")

# Availability of a GPU for a job of a given duration starting at or after a base time.
Window = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Shadow:
    start_at: float
    gpu_ids: tuple[int, ...]


def first_gap(base: float, duration_s: float, windows: Sequence[Window] | None) -> float:
    """Earliest time >= ``base`` at which ``duration_s`` fits between booking windows."""
    if not windows:
        return base
    at = base
    for start, end in windows:  # sorted by start
        if at + duration_s <= start:
            return at
        if at < end:
            at = end
    return at


def earliest_start(
    *,
    node_gpus: Iterable[tuple[int, tuple[int, ...]]],
    available: dict[int, float],
    gpu_count: int,
    is_single_node: bool,
    duration_s: float,
    windows: Mapping[int, Sequence[Window]],
) -> Shadow | None:
    """Earliest (start, GPUs) for a gang of ``gpu_count`` over the given nodes, or None.

    ``node_gpus`` yields (node index, GPU ids) of eligible schedulable nodes;
    ``available[gpu]`` is when the GPU comes free (missing: never).  A single-node gang takes
    the node whose k-th earliest GPU is earliest; a multi-node gang takes the k earliest GPUs.
    """
    if not is_single_node:
        # the k earliest GPUs anywhere: one flat pass (same pairs, so the same sort, as per node)
        if windows:
            everything = [
                (first_gap(available[g], duration_s, windows.get(g)), g)
                for _node, gpus in node_gpus
                for g in gpus
                if g in available
            ]
        else:
            everything = [(available[g], g) for _node, gpus in node_gpus for g in gpus if g in available]
        if len(everything) < gpu_count:
            return None
        everything.sort()
        start = everything[gpu_count - 1][0]
        return Shadow(start, _latest(everything, start, gpu_count))
    if gpu_count == 1:
        return _earliest_one(node_gpus, available, duration_s, windows)
    best: Shadow | None = None
    for _node, gpus in node_gpus:
        if windows:
            times = [(first_gap(available[g], duration_s, windows.get(g)), g) for g in gpus if g in available]
        else:
            times = [(available[g], g) for g in gpus if g in available]
        if len(times) < gpu_count:
            continue
        times.sort()
        start = times[gpu_count - 1][0]
        if best is None or start < best.start_at:
            best = Shadow(start, _latest(times, start, gpu_count))
    return best


def _earliest_one(
    node_gpus: Iterable[tuple[int, tuple[int, ...]]],
    available: dict[int, float],
    duration_s: float,
    windows: Mapping[int, Sequence[Window]],
) -> Shadow | None:
    """`earliest_start` of one GPU, without a sort per node: the earliest GPU, ties to the
    earlier node and then the lower GPU id (what the general single-node search picks)."""
    best_at = INF
    best_gpu: int | None = None
    for _node, gpus in node_gpus:
        node_at = INF
        node_gpu: int | None = None
        for g in gpus:
            if g not in available:
                continue
            at = first_gap(available[g], duration_s, windows.get(g)) if windows else available[g]
            if node_gpu is None or at < node_at or (at == node_at and g < node_gpu):
                node_at, node_gpu = at, g
        if node_gpu is not None and (best_gpu is None or node_at < best_at):
            best_at, best_gpu = node_at, node_gpu
    return None if best_gpu is None else Shadow(best_at, (best_gpu,))


def _latest(times: list[tuple[float, int]], start: float, gpu_count: int) -> tuple[int, ...]:
    """Of the GPUs free by ``start``, reserve those that come free last.

    GPUs free earlier stay unreserved: backfill may use them for as long as it likes, which is
    classic EASY's "extra nodes" (reserving the idle ones would be needlessly strict).
    """
    ready = [(-at, gpu) for at, gpu in times if at <= start]
    ready.sort()
    return tuple(sorted(gpu for _at, gpu in ready[:gpu_count]))
