"""Berth's gauges and counters on the existing /metrics endpoint after real engine rounds."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from django.test import Client

from scheduling.metrics import iter_metric_names, register_collectors
from tests.integration import loop
from tests.integration.loop import later, make_cluster, make_member, set_cluster_settings, submit

# Shared fixtures (assigned, not imported, so that test arguments do not shadow an import).
engine_redis_url = loop.engine_redis_url
run_round = loop.run_round
t0 = loop.t0

pytestmark = [pytest.mark.django_db]


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (labels in any order)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels} in /metrics")


def test_metrics_endpoint_shows_berth_gauges_after_a_round(engine_redis_url, run_round, t0: datetime) -> None:
    register_collectors()
    register_collectors()  # idempotent: a second call must not raise "Duplicated timeseries"
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    user, project = make_member()
    submit(user, project, cluster, gpus=3, runtime_s=3600, now=t0, name="big")
    # Allocations are checked against the wall clock at scrape time: run the rounds now.
    run_round(cluster, t0)
    submit(user, project, cluster, gpus=2, runtime_s=60, now=t0, name="waits")
    submit(user, project, cluster, gpus=2, runtime_s=60, now=t0, name="waits-too")
    run_round(cluster, later(t0, 1))
    set_cluster_settings(cluster, is_unreachable=True)
    run_round(cluster, later(t0, 2))

    text = Client().get("/metrics").content.decode()

    name = cluster.name
    assert _sample(text, "berth_gpus_total", cluster=name) == 4
    assert _sample(text, "berth_gpus_allocated", cluster=name) == 3
    assert _sample(text, "berth_queue_length", cluster=name, job_class="batch") == 2
    assert _sample(text, "berth_queue_length", cluster=name, job_class="interactive") == 0
    # One GPU is idle; the latest good round gives it exactly one reason.
    total_idle = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("berth_gpus_idle{") and f'cluster="{name}"' in line
    )
    assert total_idle == 1
    assert _sample(text, "berth_cluster_degraded", cluster=name) == 1
    assert _sample(text, "berth_engine_round_seconds_count", cluster=name) == 3
    assert _sample(text, "berth_engine_round_seconds_bucket", cluster=name, le="+Inf") == 3
    assert _sample(text, "berth_engine_round_seconds_sum", cluster=name) > 0
    assert _sample(text, "berth_engine_rounds_total", cluster=name, outcome="ok") == 2
    assert _sample(text, "berth_engine_rounds_total", cluster=name, outcome="backend_error") == 1
    assert _sample(text, "berth_backend_errors_total", cluster=name, operation="snapshot") == 1
    for metric in iter_metric_names():
        assert f"# HELP {metric}" in text
