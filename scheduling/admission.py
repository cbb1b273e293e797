"""The portal's booking admission rules as pure functions (no Django, no I/O).

One rule set for every caller: `scheduling.services.booking_create` applies them to rows read
under its node lock (the database's exclusion constraint stays the guarantee against a
double allocation), and the replay's overlay (`scheduling.sim.overlays`) applies them to the
bookings it has admitted so far, so a benchmark never books what the portal would refuse.

A booking of ``gpu_count`` GPUs of one type over ``[start, end)`` is admitted when

1. the project's booked GPUs of that type stay within its booking cap (``Quota.max_gpus``) at
   every instant of the window (`peak_concurrent` + ``gpu_count`` <= cap; no cap: no limit);
2. enough GPUs of the type are free of overlapping bookings in one cluster: capacity of the
   type minus overlapping bookings; `pick_gpus` chooses them (one node when the count fits
   one, best fit, else as few nodes as possible).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

# Times of a window: epoch seconds (the replay) or datetimes (the portal's bookings).
_Instant = TypeVar("_Instant", float, datetime)


@dataclass(frozen=True, slots=True)
class FreeNode:
    """The GPUs of one up node of the requested type that no overlapping booking holds."""

    node_id: int
    name: str
    cluster_id: int
    gpu_ids: tuple[int, ...]
    gpu_indexes: tuple[int, ...] = ()  # parallel to gpu_ids


def peak_concurrent(
    windows: Iterable[tuple[_Instant, _Instant, int]], *, start_at: _Instant, end_at: _Instant
) -> int:
    """Most GPUs that ``windows`` ``(start, end, gpus)`` hold at one instant within ``[start_at, end_at)``.

    Windows are half-open: ``[a, b)`` and ``[b, c)`` do not overlap.  The times are epoch seconds
    or datetimes, one kind per call.
    """
    events: list[tuple[_Instant, int]] = []
    for w_start, w_end, gpus in windows:
        if w_start < end_at and w_end > start_at:
            events.append((max(w_start, start_at), gpus))
            events.append((min(w_end, end_at), -gpus))
    # Ends sort before starts at the same instant.
    events.sort(key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def booking_cap_error(
    *, project: str, gpu_type: str, max_gpus: int | None, peak: int, gpu_count: int
) -> str | None:
    """The refusal sentence when ``gpu_count`` more GPUs take the project over its cap, else None."""
    if max_gpus is None or peak + gpu_count <= max_gpus:
        return None
    return (
        f"Project {project} may hold at most {max_gpus} {gpu_type} GPUs at once "
        f"and already has {peak} booked in that window."
    )


def pick_gpus(nodes: Sequence[FreeNode], *, gpu_count: int) -> tuple[tuple[int, ...], int] | None:
    """Choose GPUs in one cluster: one node when it fits there, else as few nodes as possible.

    Returns ``(gpu_ids, cluster_id)`` or ``None``.  One-node picks take the node with the
    fewest free GPUs that still fits (best fit keeps large holes for large requests).
    """
    by_cluster: dict[int, list[FreeNode]] = defaultdict(list)
    for node in nodes:
        by_cluster[node.cluster_id].append(node)
    best: tuple[tuple[int, int, str], tuple[int, ...], int] | None = None
    for cluster_id, members in by_cluster.items():
        fitting = [n for n in members if len(n.gpu_ids) >= gpu_count]
        if fitting:
            node = min(fitting, key=lambda n: (len(n.gpu_ids), n.name))
            key = (1, len(node.gpu_ids) - gpu_count, node.name)
            pick = node.gpu_ids[:gpu_count]
        else:
            if sum(len(n.gpu_ids) for n in members) < gpu_count:
                continue
            # Fill the largest holes first, then finish on the best-fitting node.
            remaining = gpu_count
            chosen: list[int] = []
            pool = sorted(members, key=lambda n: (-len(n.gpu_ids), n.name))
            while remaining > 0:
                fits = [n for n in pool if len(n.gpu_ids) >= remaining]
                if fits:
                    node = min(fits, key=lambda n: (len(n.gpu_ids), n.name))
                    chosen.extend(node.gpu_ids[:remaining])
                    remaining = 0
                else:
                    node = pool.pop(0)
                    chosen.extend(node.gpu_ids)
                    remaining -= len(node.gpu_ids)
            key = (2, len(chosen), "")
            pick = tuple(chosen)
        if best is None or key < best[0]:
            best = (key, tuple(pick), cluster_id)
    if best is None:
        return None
    return best[1], best[2]
