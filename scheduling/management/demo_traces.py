"""The demo lab's inputs: the real node list and job log (or the shipped samples), scaled to
the demo cluster, and the trace window laid over the history days with a GPU type per job.

Pure reading and arithmetic: no database.  The inventory comes from the real Alibaba GPU node
list scaled down per (GPU type, GPUs per node) group; the job history is the real KTH SP2 log
shifted in whole weeks so that it ends now.  Split from `demo_lab` (house rule: files under
600 lines, functions under 80).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent / "commands" / "demo_samples"
NODES_FILE = "alibaba_openb_2023_nodes.csv.gz"
JOBS_FILE = "pwa_kth_sp2_1996.csv.gz"
# The shipped node sample keeps one node in four (demo_samples_build.NODE_SAMPLE_FRACTION).
SAMPLE_NODE_FRACTION = 0.25
# KTH log time 0 is 1996-09-30 10:38:01 UTC (traces README); used to keep its weekly rhythm.
KTH_EPOCH = datetime(1996, 9, 30, 10, 38, 1, tzinfo=UTC)
HISTORY_SOURCE = "pwa_kth_sp2_1996"
# The KTH SP2's size (the log's header: "MaxNodes: 100"); one node becomes one GPU.
KTH_MAX_NODES = 100
# The shipped job sample keeps one job in five (demo_samples_build.JOBS_SAMPLE_EVERY).
SAMPLE_JOB_EVERY = 5


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    gpu_type: str
    gpu_count: int


@dataclass(frozen=True, slots=True)
class TraceRow:
    job_id: str
    user: str
    group: str
    submit_s: int
    start_s: int
    end_s: int
    gpu_count: int
    status: str
    requested_s: int | None


def _pick_file(traces_dir: Path | None, name: str) -> tuple[Path, bool]:
    """The real trace when it exists, else the shipped sample; the flag says which."""
    if traces_dir is not None and (traces_dir / name).is_file():
        return traces_dir / name, False
    return SAMPLES_DIR / name, True


def read_nodes(path: Path) -> list[NodeRow]:
    """Rows of an inventory CSV (``node,gpu_type,num_gpus,...``), skipping nodes without GPUs."""
    with gzip.open(path, "rt", newline="") as fh:
        rows = [
            NodeRow(name=r["node"], gpu_type=r["gpu_type"] or "GPU", gpu_count=int(r["num_gpus"]))
            for r in csv.DictReader(fh)
        ]
    return [r for r in rows if r.gpu_count > 0]


def scale_nodes(rows: Iterable[NodeRow], *, scale: float) -> list[NodeRow]:
    """Keep about ``scale`` of the nodes of every (GPU type, GPUs per node) group.

    Each group is rounded on its own, so the node sizes and the type mix survive; a GPU type
    whose groups all round to zero keeps one node of its most common size, so no type vanishes.
    Nodes are taken evenly spaced in name order: deterministic, and spread over the list.
    """
    if not 0 < scale <= 1:
        raise ValueError("scale must be in (0, 1]")
    groups: dict[tuple[str, int], list[NodeRow]] = defaultdict(list)
    for row in rows:
        groups[(row.gpu_type, row.gpu_count)].append(row)
    picked: list[NodeRow] = []
    kept_types: set[str] = set()
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda r: r.name)
        keep = min(len(members), round(len(members) * scale))
        picked.extend(_evenly(members, keep))
        if keep:
            kept_types.add(key[0])
    for gpu_type in sorted({t for t, _ in groups} - kept_types):
        size = max((k for k in groups if k[0] == gpu_type), key=lambda k: (len(groups[k]), k[1]))
        picked.extend(_evenly(sorted(groups[size], key=lambda r: r.name), 1))
    return sorted(picked, key=lambda r: r.name)


def _evenly(items: list[NodeRow], count: int) -> list[NodeRow]:
    if count <= 0:
        return []
    step = len(items) / count
    return [items[int(i * step + step / 2)] for i in range(count)]


def read_trace(path: Path) -> list[TraceRow]:
    """Jobs of a trace CSV that really ran (start and end present, at least one GPU)."""
    out: list[TraceRow] = []
    with gzip.open(path, "rt", newline="") as fh:
        for r in csv.DictReader(fh):
            if not r["start_time"] or not r["end_time"] or not r["num_gpus"]:
                continue
            requested = r.get("requested_time") or ""
            out.append(
                TraceRow(
                    job_id=r["job_id"],
                    user=r["user"] or "anonymous",
                    group=r["group"] or "",
                    submit_s=int(float(r["submit_time"])),
                    start_s=int(float(r["start_time"])),
                    end_s=int(float(r["end_time"])),
                    gpu_count=int(float(r["num_gpus"])),
                    status=r["status"],
                    requested_s=int(float(requested)) if requested and float(requested) > 0 else None,
                )
            )
    return [r for r in out if r.gpu_count > 0 and r.end_s >= r.start_s >= r.submit_s]


def history_shift(*, trace_end_s: int, now: datetime) -> timedelta:
    """How far to move the trace so that it ends at ``now`` or just after it.

    The shift is a whole number of weeks, so the log keeps its real hour-of-day and
    day-of-week rhythm (what the demand forecasts learn); jobs that would end after ``now``
    are dropped by the caller, which trims at most the last week of the log.
    """
    gap = now - (KTH_EPOCH + timedelta(seconds=trace_end_s))
    weeks = math.ceil(gap / timedelta(weeks=1))
    return timedelta(weeks=weeks)


def _stable_index(key: str, modulo: int) -> int:
    # md5 for a stable spread across runs (Python's hash() is salted); not a security use.
    return int(hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()[:8], 16) % modulo


def _weighted_pick(key: str, choices: list[tuple[str, int]]) -> str:
    total = sum(w for _, w in choices)
    point = _stable_index(key, total)
    for name, weight in choices:
        if point < weight:
            return name
        point -= weight
    return choices[-1][0]


@dataclass(frozen=True, slots=True)
class PlacedRow:
    """One use of a trace job in the demo history: its key, when it arrives, where it runs."""

    row: TraceRow
    key: str
    copy: int
    submit_at: datetime
    gpu_type: str
    gpu_count: int


def trace_load(rows: list[TraceRow], *, sample_every: int, machine_nodes: int = KTH_MAX_NODES) -> float:
    """The log's own busy fraction on its own machine: node-seconds over node-seconds there.

    ``sample_every`` undoes a thinned sample (one job in N kept), so the shipped sample and the
    full log give the same answer (0.72 and 0.70 for KTH SP2: its README says "about 70 %").
    """
    if not rows:
        return 0.0
    span = max(r.end_s for r in rows) - min(r.submit_s for r in rows)
    if span <= 0:
        return 0.0
    work = sum(r.gpu_count * (r.end_s - r.start_s) for r in rows)
    return work * sample_every / (machine_nodes * span)


def _scaled_count(gpu_count: int, pool_gpus: int, limit: int) -> int:
    """A trace job's GPUs on a pool of ``pool_gpus``: the same share of it as the job took of
    its own machine (``KTH_MAX_NODES``), at least one, at most its project's ``limit`` there."""
    return max(1, min(limit, math.ceil(gpu_count * pool_gpus / KTH_MAX_NODES)))


# A pool below this many GPUs takes a smaller share of the load (capacity x size / this): one
# long job on a 1-GPU pool at the lab's ~70 % load queues everything behind it for days (the
# 1-GPU A10 pool had ~110 GPUs of demand queued), while the same load spread over
# 100 GPUs waits minutes.
SMALL_POOL_GPUS = 4


def _load_share(gpus: int) -> float:
    """The GPUs a pool counts for when load is spread over the types (`_assign_types`)."""
    return gpus * min(1.0, gpus / SMALL_POOL_GPUS)


def _assign_types(
    placed: list[PlacedRow],
    *,
    capacity: dict[str, int],
    limits_of: Callable[[TraceRow], dict[str, int]] | None,
    work_s: Callable[[PlacedRow], float],
) -> list[PlacedRow]:
    """Give each job, in arrival order, the type whose offered GPU-hours so far are the lowest
    share of its capacity (ties by a stable hash), with the share of that pool the job took of
    its own machine (`_scaled_count`: a 64-node KTH job takes 64 % of the pool), capped at its
    project's guarantee + borrowing limit there: every type gets about the same load, and the
    lab's people size their jobs to their quotas, so no history job is one the quotas never let
    start.

    A type whose GPUs a first-come-first-served estimate (`_PoolClock`) says are busy for more
    than `QUEUE_SPILL_S` when the job arrives is passed over while another type would start it
    sooner: people send work where it starts, so the queue on every type stays in proportion to
    its size (one long job on a 1-GPU pool would otherwise queue everything behind it for days).
    """
    offered: dict[str, float] = defaultdict(float)
    clocks = {name: _PoolClock(gpus) for name, gpus in capacity.items()}
    out: list[PlacedRow] = []
    for p in sorted(placed, key=lambda p: (p.submit_at, p.key)):
        limits = limits_of(p.row) if limits_of else capacity
        work = work_s(p)
        at = p.submit_at.timestamp()
        counts = {
            name: _scaled_count(p.row.gpu_count, capacity[name], limits[name])
            for name in capacity
            if limits.get(name, 0) > 0
        }
        pressure = {
            name: (offered[name] + counts[name] * work) / _load_share(capacity[name]) for name in counts
        }
        wait = {name: clocks[name].wait_s(counts[name], at) for name in counts}
        soonest = min(wait.values(), default=0.0)
        fine = [n for n in counts if wait[n] <= max(QUEUE_SPILL_S, soonest)]
        type_name = min(fine, key=lambda name: (pressure[name], _stable_index(f"{p.key}/{name}", 997)))
        gpu_count = counts[type_name]
        offered[type_name] += gpu_count * work
        clocks[type_name].take(gpu_count, at, work)
        out.append(dataclasses.replace(p, gpu_type=type_name, gpu_count=gpu_count))
    return out


# A pool whose estimated wait is above this is passed over while another starts the job sooner.
QUEUE_SPILL_S = 3600.0


class _PoolClock:
    """When each GPU of a pool frees up, first come first served (an estimate for `_assign_types`:
    no backfill, priorities or preemption)."""

    def __init__(self, gpus: int) -> None:
        self.free_at = [0.0] * max(1, gpus)

    def wait_s(self, count: int, at: float) -> float:
        ordered = sorted(self.free_at)
        return max(0.0, ordered[min(count, len(ordered)) - 1] - at)

    def take(self, count: int, at: float, work_s: float) -> None:
        ordered = sorted(self.free_at)
        k = min(count, len(ordered))
        start = max(at, ordered[k - 1])
        self.free_at = [start + work_s] * k + ordered[k:]


def _trace_window(
    rows: list[TraceRow],
    *,
    now: datetime,
    history_days: int,
    load: float | None,
    capacity: dict[str, int],
    limits_of: Callable[[TraceRow], dict[str, int]] | None = None,
    max_uses: int = 1,
) -> tuple[list[PlacedRow], float, float]:
    """The trace jobs of the history window, where they run, the load they offer and the target.

    The log is laid over the window in whole weeks: its last ``P`` weeks (``P`` = the window
    rounded up to weeks) land on the window as they are, the ``P`` weeks before them are moved
    ``P`` weeks forward, and so on, so every job keeps its real hour of day and day of week
    (what the demand forecasts learn) and its real size and runtime.  Layers are added, most
    recent first, until the GPU-hours they ask for on the demo cluster reach ``load`` of the
    GPU-hours there (the last layer is thinned by a stable hash to land on it).  ``load`` None
    is the log's own load on its own machine (`trace_load`): the demo cluster is then as busy,
    relative to its size, as the real one was.  When the log runs out, it is laid again from
    its end, a day later each time (``copy``), at most ``max_uses`` times per job: a sample that
    kept one job in N stands for the N jobs it left out.  ``load`` 0 takes the log's last
    weeks once, at its own pace.  ``limits_of`` gives a job's per-type limits (`_assign_types`;
    default the type capacities).  Returns (placed jobs, offered load, target load).
    """
    week = timedelta(weeks=1)
    window = timedelta(days=history_days)
    lay = _Window(
        now=now,
        window_start=now - window,
        period=week * max(1, math.ceil(window / week)),
        capacity=capacity,
        limits_of=limits_of,
        max_uses=max_uses,
    )
    lay.layer(rows)
    window_gpu_s = sum(capacity.values()) * window.total_seconds()
    target = 0.0 if load == 0 else (load if load is not None else trace_load(rows, sample_every=max_uses))
    # The sizes before the type is picked are estimates: lay again with the goal corrected by
    # what the assigned sizes really offer (a few passes; each is pure arithmetic).
    goal = target * window_gpu_s
    placed = lay.lay(goal)
    offered = sum(lay.gpu_s(p) for p in placed)
    for _ in range(4):
        if goal <= 0 or offered <= 0 or abs(offered - target * window_gpu_s) < 0.03 * target * window_gpu_s:
            break
        goal *= target * window_gpu_s / offered
        placed = lay.lay(goal)
        offered = sum(lay.gpu_s(p) for p in placed)
    return placed, (offered / window_gpu_s if window_gpu_s else 0.0), target


@dataclass(slots=True)
class _Window:
    """The trace laid over the history window in layers of whole periods (`_trace_window`)."""

    now: datetime
    window_start: datetime
    period: timedelta
    capacity: dict[str, int]
    limits_of: Callable[[TraceRow], dict[str, int]] | None
    max_uses: int
    layers: int = 1
    by_layer: dict[int, list[tuple[TraceRow, datetime]]] = field(default_factory=lambda: defaultdict(list))

    def layer(self, rows: list[TraceRow]) -> None:
        """Each job's layer: how many periods back from "now" the log puts it."""
        shift = history_shift(trace_end_s=max(r.end_s for r in rows), now=self.now)
        layered: list[tuple[int, TraceRow, datetime]] = []
        for r in rows:
            at = KTH_EPOCH + shift + timedelta(seconds=r.submit_s)
            if at >= self.now:
                continue
            layer = (self.now - at) // self.period
            layered.append((layer, r, at + self.period * layer))
        self.layers = 1 + max((layer for layer, _, _ in layered), default=0)
        for layer, r, at in layered:
            self.by_layer[layer].append((r, at))

    def use(self, copy: int, r: TraceRow, at: datetime) -> PlacedRow | None:
        week = timedelta(weeks=1)
        if copy:
            # a later copy lands on a different week of the window (and a day later), wrapped in it
            later = week * copy + timedelta(days=copy // max(1, self.period // week))
            at = self.window_start + (at - self.window_start + later) % self.period
        if not self.window_start <= at < self.now:
            return None
        key = f"t{r.job_id}" + (f".{copy}" if copy else "")
        # the type is picked once the window's jobs are known (`_assign_types`, about in
        # proportion to the types' sizes); until then the job counts with that mean size
        limits = self.limits_of(r) if self.limits_of else self.capacity
        mean = sum(
            gpus * _scaled_count(r.gpu_count, gpus, limits.get(name, 0) or 1)
            for name, gpus in self.capacity.items()
        )
        return PlacedRow(r, key, copy, at, "", max(1, round(mean / sum(self.capacity.values()))))

    def per_gpu_s(self, p: PlacedRow) -> float:
        """The work it asks for inside the window (a job arriving just before now asks little)."""
        return min(float(p.row.end_s - p.row.start_s), (self.now - p.submit_at).total_seconds())

    def gpu_s(self, p: PlacedRow) -> float:
        return p.gpu_count * self.per_gpu_s(p)

    def lay(self, goal: float) -> list[PlacedRow]:
        """Layers, most recent first, until they offer ``goal`` GPU-seconds (the last thinned)."""
        placed: list[PlacedRow] = []
        offered = 0.0
        for index in range(self.layers * max(1, self.max_uses)):
            copy, layer = divmod(index, self.layers)
            candidates = [
                p for r, at in self.by_layer.get(layer, []) if (p := self.use(copy, r, at)) is not None
            ]
            if not candidates:
                continue
            if index and offered >= goal:
                break
            batch = sum(self.gpu_s(p) for p in candidates)
            if goal > 0 and offered + batch > goal and batch > 0:
                keep = (goal - offered) / batch
                candidates = [p for p in candidates if _stable_index(p.key, 10_000) < keep * 10_000]
                batch = sum(self.gpu_s(p) for p in candidates)
            placed.extend(candidates)
            offered += batch
        return _assign_types(placed, capacity=self.capacity, limits_of=self.limits_of, work_s=self.per_gpu_s)
