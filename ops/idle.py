"""Idle GPU-hours by reason, reconstructed from the engine rounds, and the drill-down of one
period.  Split from `ops.selectors` (house rule); callers check ``is_staff``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from ops.tables import Range, Table, _label
from ops.usage import _before_record, _no_data_note, _span_text
from scheduling.engine.types import IdleReason
from scheduling.models import Allocation, EngineRound, Gpu, Job

# A round's idle counts hold until the next round, but no longer than this (a stopped loop
# must not paint hours of idleness from one stale round).
ROUND_HOLD_MAX = timedelta(minutes=5)
IDLE_REASONS: tuple[str, ...] = tuple(r.value for r in IdleReason)
# A job's reason is stored while it waits; one that has started since (or a job of the replayed
# history) has none for that instant.
NO_REASON = "Not stored: a job's reason is kept only while it is waiting."

# ---- idle GPU-hours by reason ----


def _rounds(
    cluster_id: int, rng: Range, now: datetime
) -> list[tuple[datetime, dict[str, int], int, timedelta]]:
    """Rounds that can hold into the range: (instant, idle counts, id, how long the count holds
    at most: `ROUND_HOLD_MAX`, or the replayed gap to the next round for history rounds)."""
    rows = list(
        EngineRound.objects.filter(
            cluster_id=cluster_id,
            error="",
            started_at__gte=rng.start_at - ROUND_HOLD_MAX,
            started_at__lt=min(rng.end_at, now),
        )
        .order_by("started_at", "id")
        .values_list("started_at", "decisions", "id")
    )
    out = []
    for at, d, pk in rows:
        decisions = d or {}
        hold = decisions.get("hold_s")
        limit = (
            timedelta(seconds=float(hold)) if isinstance(hold, int | float) and hold > 0 else ROUND_HOLD_MAX
        )
        out.append((at, dict(decisions.get("idle", {})), pk, max(limit, ROUND_HOLD_MAX)))
    return out


def idle_get(*, cluster_id: int, rng: Range, now: datetime | None = None) -> Table:
    """Idle GPU-hours by idle reason per bucket, reconstructed from the engine rounds.

    A round stores how many GPUs were idle for each reason at its instant
    (``EngineRound.decisions["idle"]``).  Each count is held until the next round, at most
    `ROUND_HOLD_MAX` (and not past now or the range): idle GPU-hours = GPUs x that interval.
    """
    now = now or timezone.now()
    rounds = _rounds(cluster_id, rng, now)
    first_at = (
        EngineRound.objects.filter(cluster_id=cluster_id, error="")
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    before = _before_record(rng, first_at)
    n = len(rng.starts())
    hours: dict[str, list[float]] = {r: [0.0] * n for r in IDLE_REASONS}
    stop = min(rng.end_at, now)
    for k, (at, idle, _, hold) in enumerate(rounds):
        nxt = rounds[k + 1][0] if k + 1 < len(rounds) else stop
        upper = min(nxt, at + hold, stop)
        t = max(at, rng.start_at)  # a round just before the range holds into it
        i = rng.index(t)
        while t < upper and i < n:
            edge = min(rng.start_at + (i + 1) * rng.step, upper)
            for reason, count in idle.items():
                hours.setdefault(reason, [0.0] * n)[i] += count * (edge - t).total_seconds() / 3600.0
            t, i = edge, i + 1
    reasons = [r for r in hours if any(hours[r])] or list(IDLE_REASONS[:1])
    return Table(
        name="idle-by-reason",
        caption="Idle GPU-hours by reason (reconstructed from engine rounds)",
        headers=("Period", *reasons),
        rows=tuple(
            (_label(s, rng.bucket), *(None if before[i] else round(hours[r][i], 2) for r in reasons))
            for i, s in enumerate(rng.starts())
        ),
        chart="stacked",
        extra={"drill": True},
        note=_no_data_note(before, first_at, "the first engine round was recorded"),
        empty_reason=(
            f"No engine round was recorded {_span_text(rng, now)} (the engine loop was not running), "
            "so nothing says which GPUs were idle or why."
            if not rounds
            else f"No GPU was idle {_span_text(rng, now)}: every round found every GPU in use."
        ),
    )


def _indexes(values: Sequence[int]) -> str:
    """GPU indexes as short ranges: ``0-3, 6``."""
    out: list[str] = []
    for value in sorted(values):
        if out and "-" not in out[-1].split(", ")[-1] and int(out[-1]) == value - 1:
            out[-1] = f"{out[-1]}-{value}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == value - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{value}"
        else:
            out.append(str(value))
    return ", ".join(out) or "none free"


@dataclass(frozen=True, slots=True)
class IdleDrill:
    round_id: int | None
    at: datetime | None
    idle: dict[str, int]
    gpus: Table
    jobs: Table


def _idle_groups(*, cluster_id: int, at: datetime, decisions: dict[str, Any]) -> list[tuple[Any, ...]]:
    """(node, type, node state, reason, idle GPUs, free GPU indexes) rows of a round."""
    busy = set(
        Allocation.objects.filter(gpu__node__cluster_id=cluster_id, period__contains=at)
        .exclude(state=Allocation.State.RELEASED)
        .values_list("gpu_id", flat=True)
    )
    free_by_node: dict[str, list[int]] = defaultdict(list)
    node_info: dict[str, tuple[str, str]] = {}
    for gid, node, index, type_name, status in (
        Gpu.objects.filter(node__cluster_id=cluster_id)
        .order_by("node__name", "index")
        .values_list("id", "node__name", "index", "node__gpu_type__name", "node__status")
    ):
        node_info[node] = (type_name, status)
        if gid not in busy:
            free_by_node[node].append(index)
    # One row per node and idle reason: the round's own per-node counts where it stored them
    # (rounds since per-node counts exist, and the last replayed round of each hour), else the
    # node's free GPUs under "not recorded".
    by_node = decisions.get("idle_nodes")
    groups: list[tuple[Any, ...]] = []
    if isinstance(by_node, dict) and by_node:
        for node in sorted(by_node):
            type_name, status = node_info.get(node, ("?", "?"))
            free = free_by_node.get(node, [])
            for reason, count in sorted(by_node[node].items(), key=lambda kv: (-kv[1], kv[0])):
                groups.append((node, type_name, status, reason, count, _indexes(free)))
    else:
        for node in sorted(free_by_node):
            type_name, status = node_info[node]
            free = free_by_node[node]
            groups.append((node, type_name, status, "not recorded", len(free), _indexes(free)))
    return groups


def idle_drill_get(*, cluster_id: int, start_at: datetime, end_at: datetime) -> IdleDrill:
    """The latest round in ``[start_at, end_at)``: its idle counts, the GPUs that were free at its
    instant (no allocation covering it) with their node state, and the jobs pending then.

    Rounds store counts by reason, not which GPU had which reason, so the GPU list is rebuilt
    from allocations and node state, and each pending job shows its latest stored reason.
    """
    in_period = EngineRound.objects.filter(
        cluster_id=cluster_id, error="", started_at__gte=start_at, started_at__lt=end_at
    ).order_by("-started_at", "-id")
    # The latest round that stored its idle GPUs per node (replayed history keeps them for the
    # last round of each hour), else the latest round: "not recorded" rows say less.
    row = (
        in_period.filter(decisions__has_key="idle_nodes").values_list("id", "started_at", "decisions").first()
        or in_period.values_list("id", "started_at", "decisions").first()
    )
    if row is None:
        empty = Table(name="idle-gpus", caption="No engine round in this period", headers=("GPU",), rows=())
        return IdleDrill(
            None, None, {}, empty, Table(name="idle-jobs", caption="", headers=("Job",), rows=())
        )
    pk, at, decisions = row
    groups = _idle_groups(cluster_id=cluster_id, at=at, decisions=decisions or {})
    total = sum(g[4] for g in groups)
    pending = (
        Job.objects.filter(cluster_id=cluster_id, submitted_at__lte=at)
        .filter(Q(started_at__isnull=True) | Q(started_at__gt=at))
        .exclude(status=Job.Status.CANCELLED, ended_at__lte=at)
        .order_by("submitted_at", "id")
        .values_list(
            "id", "name", "project__slug", "gpu_count", "gpu_type__name", "pending_reason", "pending_sentence"
        )[:200]
    )
    return IdleDrill(
        pk,
        at,
        dict((decisions or {}).get("idle", {})),
        Table(
            name="idle-gpus",
            caption=f"{total} idle GPU(s) on {len({g[0] for g in groups})} node(s), by node and reason",
            headers=("Node", "Type", "Node state", "Reason", "Idle GPUs", "Free GPU indexes"),
            rows=tuple(groups),
            extra={"label_columns": [3]},
        ),
        Table(
            name="idle-jobs",
            caption="Jobs pending at the round (with their latest reason)",
            headers=("Job", "Name", "Project", "GPUs", "Type", "Reason", "Why"),
            rows=tuple((j, n, p, c, t or "any", r, s or NO_REASON) for j, n, p, c, t, r, s in pending),
            extra={"pending_columns": [5]},
        ),
    )
