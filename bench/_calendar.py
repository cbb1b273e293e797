"""The alternatives phase of `bench.round` (``--alternatives-bookings N``): a refused booking's
search for free windows (`scheduling.alternatives.booking_alternatives`, what a 409 answers
with) on a calendar of N bookings.

The calendar is a cluster of its own (32 nodes of 8 GPUs of a type no other cluster has, so the
search reads only its GPUs, like a 256-GPU site): N non-overlapping bookings of 1-8 GPUs of one
node, 1-8 h long with gaps of 0-60 min, packed from now on (20,000 of them reach ~50 days
ahead), written in bulk (the service would take minutes; the search reads only the rows).
Every request timed is one the calendar refuses: 1, 4 or 8 GPUs for 1, 8 or 48 h starting in
an hour, where every GPU is booked.  Each is asked ``repeat`` times, in an order shuffled with
the seed; ``alternatives_ms`` holds the quantiles of the calls (the first is a cold cache).
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta
from typing import Any

from scheduling.stats import quantile

CALENDAR_NODES = 32
CALENDAR_GPUS_PER_NODE = 8
COUNTS = (1, 4, 8, 32, 128)
HOURS = (1, 8, 48)


def calendar_fill(*, bookings: int, now: datetime, seed: int) -> dict[str, Any]:
    """The calendar cluster and its bookings; returns the objects the search needs."""
    from django.contrib.auth import get_user_model

    from portal.accounts.models import Membership, Project
    from scheduling.models import Cluster, Gpu, GpuType, Node

    # 96 GiB: no other type has as much, so the bench-round cluster's A100s are not candidates.
    gpu_type = GpuType.objects.create(name="CAL96", memory_gib=96.0, precisions=["bf16"], value=1.0)
    cluster = Cluster.objects.create(name="bench-calendar", backend=Cluster.Backend.SIMULATOR)
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"c{i:02d}", gpu_type=gpu_type, gpu_count=CALENDAR_GPUS_PER_NODE)
        for i in range(CALENDAR_NODES)
    )
    Gpu.objects.bulk_create(Gpu(node=n, index=i) for n in nodes for i in range(CALENDAR_GPUS_PER_NODE))
    project = Project.objects.create(slug="calendar", name="Calendar")
    user = get_user_model().objects.create(username="calendar")
    Membership.objects.create(user=user, project=project, role=Membership.Role.MEMBER)
    reach = bookings_fill(
        cluster=cluster, gpu_type=gpu_type, user=user, project=project, bookings=bookings, now=now, seed=seed
    )
    return {"gpu_type": gpu_type, "cluster": cluster, "reach": reach}


def bookings_fill(
    *, cluster: Any, gpu_type: Any, user: Any, project: Any, bookings: int, now: datetime, seed: int
) -> timedelta:
    """``bookings`` non-overlapping bookings of ``cluster``'s ``gpu_type`` nodes from ``now`` on:
    1 to all GPUs of one node, 1-8 h long, gaps of 0-60 min, written in bulk (the service would
    take minutes; the search reads only the rows).  Returns how far ahead the calendar reaches."""
    from django.db import connection
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    from scheduling.models import Allocation, Booking, Gpu, Node

    rng = random.Random(seed)
    nodes = list(Node.objects.filter(cluster=cluster, gpu_type=gpu_type).order_by("id"))
    gpus: dict[int, list[int]] = {n.pk: [] for n in nodes}
    for node_id, gpu_id in (
        Gpu.objects.filter(node__in=nodes).order_by("node_id", "index").values_list("node_id", "id")
    ):
        gpus[node_id].append(gpu_id)
    free_at = {g: now for ids in gpus.values() for g in ids}
    rows: list[Any] = []
    spans: list[tuple[list[int], datetime, datetime]] = []
    for _ in range(bookings):
        node = rng.choice(nodes)
        chosen = rng.sample(gpus[node.pk], rng.randint(1, len(gpus[node.pk])))
        start = max(free_at[g] for g in chosen) + timedelta(minutes=rng.choice((0, 0, 30, 60)))
        end = start + timedelta(hours=rng.randint(1, 8))
        for g in chosen:
            free_at[g] = end
        rows.append(
            Booking(
                user=user,
                project=project,
                cluster=cluster,
                gpu_type=gpu_type,
                gpu_count=len(chosen),
                start_at=start,
                end_at=end,
            )
        )
        spans.append((chosen, start, end))
    Booking.objects.bulk_create(rows, batch_size=2_000)
    Allocation.objects.bulk_create(
        (
            Allocation(gpu_id=g, booking=b, period=DateTimeTZRange(start, end, "[)"))
            for b, (chosen, start, end) in zip(rows, spans, strict=True)
            for g in chosen
        ),
        batch_size=5_000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_allocation")
    return max(free_at.values(), default=now) - now


def alternatives_phase(*, bookings: int, now: datetime, seed: int, repeat: int = 4) -> dict[str, Any]:
    """Fill the calendar, then time the search for refused requests (module docstring)."""
    from scheduling.alternatives import booking_alternatives

    calendar = calendar_fill(bookings=bookings, now=now, seed=seed)
    soon = now + timedelta(hours=1)
    requests = [(count, hours) for count in COUNTS for hours in HOURS] * repeat
    random.Random(seed).shuffle(requests)
    times_ms: list[float] = []  # of the refused requests only: the search is what a 409 costs
    all_ms: list[float] = []
    by_request: dict[str, list[float]] = {}
    offered = 0
    for count, hours in requests:
        started = time.perf_counter()
        found = booking_alternatives(
            gpu_type=calendar["gpu_type"],
            gpu_count=count,
            start_at=soon,
            end_at=soon + timedelta(hours=hours),
            cluster_ids=None,
        )
        elapsed = (time.perf_counter() - started) * 1000.0
        all_ms.append(elapsed)
        offered += len(found)
        # Free at the requested start: the booking would have been accepted, no search.
        if found and found[0].start_at == soon and found[0].gpu_type == calendar["gpu_type"].name:
            continue
        times_ms.append(elapsed)
        by_request.setdefault(f"{count}x{hours}h", []).append(elapsed)
    return {
        "bookings": bookings,
        "gpus": CALENDAR_NODES * CALENDAR_GPUS_PER_NODE,
        "calendar_days": round(calendar["reach"].total_seconds() / 86_400, 1),
        "calls": len(all_ms),
        "refused_calls": len(times_ms),
        "offered": offered,
        "alternatives_ms_p50": quantile(times_ms, 0.5, method="nearest"),
        "alternatives_ms_p99": quantile(times_ms, 0.99, method="nearest"),
        "alternatives_ms_max": max(times_ms, default=0.0),
        "all_calls_ms_p99": quantile(all_ms, 0.99, method="nearest"),
        "by_request_ms_max": {key: max(values) for key, values in sorted(by_request.items())},
    }
