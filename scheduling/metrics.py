"""Berth's Prometheus metrics on the default ``prometheus_client`` registry (served at /metrics).

Engine rounds run in Celery worker processes while /metrics is served by the web processes,
so nothing here lives in process memory:

* gauges are read from the database at scrape time (GPUs allocated now, idle GPUs by the idle
  reason of each cluster's latest round, queue length by job class, degraded clusters);
* the round-latency histogram and the counters are kept in Redis (``BERTH_ENGINE_REDIS_URL``)
  by `round_observe` and `backend_error_count`, and read back at scrape time.

`register_collectors()` adds the collector once per process; call it from ``AppConfig.ready``.
A scrape never fails because of Berth: a database or Redis error drops only Berth's samples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

import redis
from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduling.engine.types import IdleReason
from scheduling.models import Allocation, Cluster, EngineRound, Job

logger = logging.getLogger(__name__)

ROUND_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_KEY = "berth:metrics"


def _redis() -> redis.Redis:
    from scheduling.backend_registry import engine_redis

    return engine_redis(settings.BERTH_ENGINE_REDIS_URL)


def _fmt_le(bound: float) -> str:
    return repr(float(bound))


def round_observe(*, cluster: str, duration_s: float, outcome: str) -> None:
    """Count one engine round and its latency; never raises (metrics must not break a round)."""
    try:
        pipe = _redis().pipeline()
        key = f"{_KEY}:round_seconds:{cluster}"
        for bound in ROUND_BUCKETS_S:
            if duration_s <= bound:
                pipe.hincrby(key, _fmt_le(bound), 1)
        pipe.hincrby(key, "+Inf", 1)
        pipe.hincrbyfloat(key, "sum", duration_s)
        pipe.hincrby(f"{_KEY}:rounds_total", f"{cluster}|{outcome}", 1)
        pipe.execute()
    except Exception:
        logger.warning("could not record round metrics for %s", cluster, exc_info=True)


def backend_error_count(*, cluster: str, operation: str) -> None:
    """Count one backend failure (``snapshot``, ``apply``, ``start``, ``preempt``, ...); never raises."""
    try:
        _redis().hincrby(f"{_KEY}:backend_errors_total", f"{cluster}|{operation}", 1)
    except Exception:
        logger.warning("could not record a backend error metric for %s", cluster, exc_info=True)


def _decode(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    def text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    return {text(k): text(v) for k, v in raw.items()}


class BerthCollector(Collector):
    """Reads Berth's gauges from the database and its counters from Redis at scrape time."""

    def describe(self) -> Iterable[Metric]:
        # Declared without samples so registering does not touch the database.
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        try:
            self._fill_from_db(families)
        except Exception:
            logger.warning("berth metrics: database read failed", exc_info=True)
        try:
            self._fill_from_redis(families)
        except Exception:
            logger.warning("berth metrics: redis read failed", exc_info=True)
        return list(families.values())

    @staticmethod
    def _families() -> dict[str, Metric]:
        return {
            "allocated": GaugeMetricFamily(
                "berth_gpus_allocated", "GPUs held by running jobs or active bookings now", labels=["cluster"]
            ),
            "total": GaugeMetricFamily("berth_gpus_total", "GPUs in the cluster", labels=["cluster"]),
            "idle": GaugeMetricFamily(
                "berth_gpus_idle",
                "Idle GPUs by idle reason, as of the cluster's latest engine round",
                labels=["cluster", "reason"],
            ),
            "queue": GaugeMetricFamily(
                "berth_queue_length", "Pending jobs by job class", labels=["cluster", "job_class"]
            ),
            "degraded": GaugeMetricFamily(
                "berth_cluster_degraded", "1 while the cluster's backend is unreachable", labels=["cluster"]
            ),
            "latency": HistogramMetricFamily(
                "berth_engine_round_seconds", "Wall time of one engine round", labels=["cluster"]
            ),
            "rounds": CounterMetricFamily(
                "berth_engine_rounds", "Engine rounds by outcome", labels=["cluster", "outcome"]
            ),
            "errors": CounterMetricFamily(
                "berth_backend_errors", "Backend failures by operation", labels=["cluster", "operation"]
            ),
        }

    @staticmethod
    def _fill_from_db(families: dict[str, Metric]) -> None:
        now = timezone.now()
        clusters = list(Cluster.objects.filter(is_active=True).order_by("name"))
        names = {c.pk: c.name for c in clusters}
        allocated = dict(
            Allocation.objects.filter(
                gpu__node__cluster_id__in=names,
                state__in=(Allocation.State.ACTIVE, Allocation.State.PLANNED),
                period__contains=now,
            )
            .values("gpu__node__cluster_id")
            .annotate(n=Count("gpu_id", distinct=True))
            .values_list("gpu__node__cluster_id", "n")
        )
        totals = dict(
            Cluster.objects.filter(pk__in=names).annotate(n=Count("nodes__gpus")).values_list("pk", "n")
        )
        queue = {
            (row["cluster_id"], row["kind"]): row["n"]
            for row in Job.objects.filter(cluster_id__in=names, status=Job.Status.PENDING)
            .values("cluster_id", "kind")
            .annotate(n=Count("id"))
        }
        for cluster in clusters:
            name = cluster.name
            families["allocated"].add_metric([name], allocated.get(cluster.pk, 0))  # type: ignore[attr-defined]
            families["total"].add_metric([name], totals.get(cluster.pk, 0))  # type: ignore[attr-defined]
            families["degraded"].add_metric([name], 1 if cluster.is_degraded else 0)  # type: ignore[attr-defined]
            for kind in Job.Kind.values:
                families["queue"].add_metric([name, kind], queue.get((cluster.pk, kind), 0))  # type: ignore[attr-defined]
            latest = (
                EngineRound.objects.filter(cluster=cluster, error="").order_by("-started_at", "-id").first()
            )
            idle = (latest.decisions or {}).get("idle", {}) if latest is not None else {}
            for reason in IdleReason:
                families["idle"].add_metric([name, reason.value], idle.get(reason.value, 0))  # type: ignore[attr-defined]

    @staticmethod
    def _fill_from_redis(families: dict[str, Metric]) -> None:
        client = _redis()
        for key in client.scan_iter(match=f"{_KEY}:round_seconds:*", count=100):
            cluster = key.decode().rsplit(":", 1)[1]
            data = _decode(client.hgetall(key))
            buckets = [(_fmt_le(b), float(data.get(_fmt_le(b), 0))) for b in ROUND_BUCKETS_S]
            buckets.append(("+Inf", float(data.get("+Inf", 0))))
            families["latency"].add_metric(  # type: ignore[attr-defined]
                [cluster], buckets=buckets, sum_value=float(data.get("sum", 0.0))
            )
        for family, key in (("rounds", "rounds_total"), ("errors", "backend_errors_total")):
            for field, value in _decode(client.hgetall(f"{_KEY}:{key}")).items():
                cluster, _, label = field.partition("|")
                families[family].add_metric([cluster, label], float(value))  # type: ignore[attr-defined]


_collector: BerthCollector | None = None


def register_collectors() -> BerthCollector:
    """Add Berth's collector to the default registry once per process (idempotent)."""
    global _collector
    if _collector is None:
        _collector = BerthCollector()
        REGISTRY.register(_collector)
    return _collector


def iter_metric_names() -> Iterator[str]:
    """The metric names Berth exports (for docs and tests)."""
    for family in BerthCollector._families().values():
        yield family.name
