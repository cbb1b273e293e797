"""The demo lab: scaling keeps the GPU mix, history ends now, and building twice changes nothing.

The command runs on the samples the project ships (an empty ``--traces`` directory forces
them), against the real PostgreSQL test database and the real booking service.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db.models import Max, Min, Sum
from django.test import Client

from portal.accounts.models import Membership, Project, Quota
from scheduling.management.demo_lab import (
    CLUSTER_NAME,
    KTH_EPOCH,
    PROJECTS,
    QUEUED_JOBS,
    RESEARCHERS,
    SAMPLES_DIR,
    NodeRow,
    history_shift,
    read_nodes,
    read_trace,
    scale_nodes,
)
from scheduling.models import Allocation, Booking, Cluster, Gpu, GpuType, Job, Node
from scheduling.services import booking_create
from tests.factories import MembershipFactory


@pytest.fixture
def sim_state() -> Iterator[None]:
    """The live simulator's state of this test database (real Redis), removed afterwards."""
    from django.conf import settings
    from django.db import connection

    from scheduling.backend_registry import engine_redis

    client = engine_redis(settings.BERTH_ENGINE_REDIS_URL)
    pattern = f"berth:livesim:{connection.settings_dict['NAME']}:*"
    yield
    keys = list(client.scan_iter(match=pattern, count=500))
    if keys:
        client.delete(*keys)


@contextlib.contextmanager
def mock_apply_async() -> Iterator[list[Any]]:
    """Records the forecast task's messages instead of sending them: no worker runs in this test
    (the Celery integration tests run a real one); what is checked is that one is queued."""
    from forecasting.tasks import forecast_refresh_now

    sent: list[Any] = []
    with mock.patch.object(forecast_refresh_now, "apply_async", lambda args, **_: sent.append(args)):
        yield sent


def _nodes(spec: dict[tuple[str, int], int]) -> list[NodeRow]:
    return [
        NodeRow(name=f"{gpu_type}-{size}-{i:03d}", gpu_type=gpu_type, gpu_count=size)
        for (gpu_type, size), count in spec.items()
        for i in range(count)
    ]


# ---- pure helpers (no database) ----


def test_scaling_keeps_group_sizes_in_proportion_and_every_type() -> None:
    rows = _nodes({("G2", 8): 400, ("T4", 2): 200, ("T4", 4): 20, ("A10", 1): 2})

    kept = scale_nodes(rows, scale=0.05)

    by_group: dict[tuple[str, int], int] = {}
    for row in kept:
        by_group[(row.gpu_type, row.gpu_count)] = by_group.get((row.gpu_type, row.gpu_count), 0) + 1
    assert by_group[("G2", 8)] == 20
    assert by_group[("T4", 2)] == 10
    assert by_group[("T4", 4)] == 1
    # A10 rounds to zero nodes but keeps one, so no GPU type vanishes from the demo.
    assert by_group[("A10", 1)] == 1
    assert len({r.name for r in kept}) == len(kept)


def test_scaling_is_deterministic_and_spread_over_the_list() -> None:
    rows = _nodes({("G2", 8): 100})
    first = scale_nodes(rows, scale=0.1)
    assert first == scale_nodes(list(reversed(rows)), scale=0.1)
    indexes = [int(r.name.rsplit("-", 1)[1]) for r in first]
    assert indexes[0] < 10
    assert indexes[-1] >= 90


@pytest.mark.parametrize("scale", [0.0, -0.1, 1.5])
def test_scaling_rejects_a_fraction_outside_0_1(scale: float) -> None:
    with pytest.raises(ValueError, match="scale"):
        scale_nodes(_nodes({("G2", 8): 4}), scale=scale)


@pytest.mark.parametrize(
    "now",
    [datetime(2026, 11, 30, 9, 0, tzinfo=UTC), datetime(2027, 3, 1, 23, 59, tzinfo=UTC)],
)
def test_history_shift_is_whole_weeks_and_ends_within_a_week_after_now(now: datetime) -> None:
    trace_end_s = 28_765_020
    shift = history_shift(trace_end_s=trace_end_s, now=now)

    assert shift % timedelta(weeks=1) == timedelta(0)  # keeps weekday and hour of day
    end = KTH_EPOCH + timedelta(seconds=trace_end_s) + shift
    assert now <= end < now + timedelta(weeks=1)


def test_shipped_samples_are_small_and_readable() -> None:
    for path in SAMPLES_DIR.glob("*.csv.gz"):
        assert path.stat().st_size < 300 * 1024, path
    nodes = read_nodes(SAMPLES_DIR / "alibaba_openb_2023_nodes.csv.gz")
    jobs = read_trace(SAMPLES_DIR / "pwa_kth_sp2_1996.csv.gz")
    assert 100 <= len(nodes) <= 1000
    assert len({n.gpu_type for n in nodes}) >= 5
    assert len(jobs) > 1000
    assert all(j.end_s >= j.start_s >= j.submit_s and j.gpu_count >= 1 for j in jobs)


# ---- the command ----


def _counts() -> dict[str, int]:
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    return {
        "nodes": Node.objects.filter(cluster=cluster).count(),
        "gpus": Gpu.objects.filter(node__cluster=cluster).count(),
        "jobs": Job.objects.filter(cluster=cluster).count(),
        "bookings": Booking.objects.filter(cluster=cluster).count(),
        "allocations": Allocation.objects.filter(booking__cluster=cluster).count(),
        "projects": Project.objects.filter(slug__in=[p.slug for p in PROJECTS]).count(),
        "memberships": Membership.objects.filter(project__slug__in=[p.slug for p in PROJECTS]).count(),
        "quotas": Quota.objects.filter(project__slug__in=[p.slug for p in PROJECTS]).count(),
    }


@pytest.fixture
def fast_hasher(settings: Any) -> None:
    # PBKDF2 costs ~0.5 s per password on this machine; the hash algorithm is not under test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# The fast path of the command for tests: a week of history, no forecast fit (the e2e demo test
# fits them), and a pinned "now" so that two builds replay exactly the same history.
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
FAST = ["--scale", "0.01", "--history-days", "7", "--forecasts", "skip", "--now", NOW.isoformat()]


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_hasher")
def test_demo_lab_builds_from_the_shipped_samples_and_is_idempotent(
    tmp_path: Path, nodes: list[Node], a100: GpuType, soon: datetime, sim_state: None
) -> None:
    args = ["--traces", str(tmp_path), *FAST]
    call_command("demo_lab", *args, stdout=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    output = (tmp_path / "out.txt").read_text()

    counts = _counts()
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    assert "shipped sample" in output
    assert "Logins" in output
    assert "admin" in output
    # 1% of the real inventory (a quarter of it is in the sample): small, but every type.
    assert 8 <= counts["nodes"] <= 40
    assert counts["gpus"] == Node.objects.filter(cluster=cluster).aggregate(n=Sum("gpu_count"))["n"]
    assert Node.objects.filter(cluster=cluster).values("gpu_type").distinct().count() == 7
    assert counts["projects"] == len(PROJECTS)
    assert counts["memberships"] == sum(len(p.members) for p in PROJECTS)

    history = Job.objects.filter(cluster=cluster, payload__source="pwa_kth_sp2_1996")
    finished = history.filter(status__in=[Job.Status.COMPLETED, Job.Status.FAILED])
    assert finished.count() > 50
    assert set(history.values_list("status", flat=True)) <= {
        Job.Status.COMPLETED,
        Job.Status.FAILED,
        Job.Status.RUNNING,
        Job.Status.PENDING,
    }
    span = finished.aggregate(first=Min("first_submitted_at"), last=Max("ended_at"))
    assert span["first"] >= NOW - timedelta(days=7)
    assert span["last"] <= NOW
    assert span["last"] >= NOW - timedelta(days=1)  # the history reaches (nearly) now
    assert set(history.values_list("user__username", flat=True)) <= {u for u, _, _ in RESEARCHERS}
    # No job asks for more GPUs of its type than the demo cluster has.
    capacity: dict[int, int] = {}
    for type_id, gpu_count in Node.objects.filter(cluster=cluster).values_list("gpu_type_id", "gpu_count"):
        capacity[type_id] = capacity.get(type_id, 0) + gpu_count
    for type_id, gpu_count in history.exclude(gpu_type=None).values_list("gpu_type_id", "gpu_count"):
        assert 1 <= gpu_count <= capacity[type_id]
    # Upcoming bookings went through booking_create: each holds one allocation per GPU.
    assert counts["bookings"] >= 3
    for booking in Booking.objects.filter(cluster=cluster):
        assert booking.allocations.count() == booking.gpu_count
        assert booking.start_at > NOW

    # A few jobs wait for the engine, queued through job_submit like any other job.
    queued = Job.objects.filter(cluster=cluster, status=Job.Status.PENDING).exclude(
        payload__source="pwa_kth_sp2_1996"
    )
    assert 3 <= queued.count() <= len(QUEUED_JOBS)
    assert counts["jobs"] == history.count() + queued.count()

    call_command("demo_lab", *args, stdout=open(tmp_path / "again.txt", "w"))  # noqa: SIM115
    assert _counts() == counts

    # A demo user's work elsewhere must not block the reset (bookings protect users and projects).
    ada = User.objects.get(username="ada")
    other_project = MembershipFactory(user=ada).project
    elsewhere = booking_create(
        ada,
        project=other_project,
        gpu_type=a100,
        cluster=nodes[0].cluster,
        gpu_count=1,
        start_at=soon,
        end_at=soon + timedelta(hours=1),
    )

    call_command("demo_lab", *args, "--reset", stdout=open(tmp_path / "reset.txt", "w"))  # noqa: SIM115
    assert not Booking.objects.filter(pk=elsewhere.pk).exists()
    assert Node.objects.filter(pk=nodes[0].pk).exists()  # other clusters and projects stay
    assert Project.objects.filter(pk=other_project.pk).exists()
    # The same pinned "now" replays the same history: every count is equal, not "about".
    assert _counts() == counts
    assert Cluster.objects.filter(name=CLUSTER_NAME).count() == 1
    # The printed logins work.
    assert Client().login(username="admin", password="berth-admin")
    assert Client().login(username="ada", password="berth-demo")


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_hasher")
def test_jobs_running_at_now_stay_running_on_the_live_simulator(tmp_path: Path, sim_state: None) -> None:
    """Replayed jobs still running at "now" are running jobs with allocations open at now, and the
    live simulator runs them; demand does not drop to zero in the hours before now."""
    from scheduling.backend_registry import backend_for_cluster

    call_command("demo_lab", "--traces", str(tmp_path), *FAST, stdout=open(tmp_path / "o.txt", "w"))  # noqa: SIM115
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    running = list(Job.objects.filter(cluster=cluster, status=Job.Status.RUNNING))
    assert running, "a busy lab has work running at now"
    records = backend_for_cluster(cluster).records()
    for job in running:
        active = list(job.allocations.filter(state=Allocation.State.ACTIVE))
        assert len(active) == job.gpu_count
        for allocation in active:
            assert allocation.period.lower <= NOW
            assert allocation.period.upper is None or allocation.period.upper > NOW
        record = records[str(job.pk)]
        assert record["state"] == "running"
        assert sorted(record["gpu_ids"]) == sorted(a.gpu_id for a in active)
        assert job.payload["sim_runtime_s"] > 0
    # Busy GPU-hours in each of the last 6 hours before now: the running jobs keep them up.
    from ops.selectors import Range, utilization_get

    rng = Range(start_at=NOW - timedelta(hours=6), end_at=NOW, bucket="hour")
    by_type = utilization_get(cluster_id=cluster.pk, rng=rng, now=NOW)[0]
    for row in by_type.rows:
        assert sum(v for v in row[1:-1]) > 0, row
    # Jobs that had not started by now wait in the queue with what is left of their work.
    pending = Job.objects.filter(
        cluster=cluster, status=Job.Status.PENDING, payload__source="pwa_kth_sp2_1996"
    )
    assert all(j.started_at is None and j.payload["command"] for j in pending)
    # None of them is one the quotas never let start: above its project's guarantee it is preemptible.
    guarantee = {(q.project_id, q.gpu_type_id): q.guaranteed_gpus for q in Quota.objects.all()}
    for job in [*pending, *running]:
        if job.kind == Job.Kind.BATCH and job.gpu_count > guarantee.get((job.project_id, job.gpu_type_id), 0):
            assert job.is_preemptible, job


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_hasher")
def test_forecasts_queue_leaves_the_fit_to_a_worker_and_says_fitting(
    tmp_path: Path, settings: Any, sim_state: None, django_capture_on_commit_callbacks: Any
) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    args = ["--traces", str(tmp_path), "--scale", "0.01", "--history-days", "1"]
    args += ["--forecasts", "queue", "--now", NOW.isoformat()]
    with mock_apply_async() as sent, django_capture_on_commit_callbacks(execute=True):
        call_command("demo_lab", *args, "--no-queue", stdout=open(tmp_path / "o.txt", "w"))  # noqa: SIM115
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    assert sent == [[cluster.pk]]
    assert "queued for the Celery worker" in (tmp_path / "o.txt").read_text()
    from forecasting.models import ForecastRun

    assert not ForecastRun.objects.filter(cluster=cluster).exists()
    client = Client()
    assert client.login(username="admin", password="berth-admin")
    page = client.get(f"/ops/capacity/?cluster={cluster.pk}").content.decode()
    assert "fitting… (queued for a worker)" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scale", "0"], "--scale"),
        (["--scale", "2"], "--scale"),
        (["--history-days", "-1"], "--history-days"),
        (["--traces", "/nonexistent/traces"], "no such directory"),
    ],
)
def test_demo_lab_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("demo_lab", *args)
    assert not Cluster.objects.filter(name=CLUSTER_NAME).exists()


@pytest.mark.django_db
def test_demo_lab_refuses_production_without_the_flag(settings: object, tmp_path: Path) -> None:
    settings.IS_PRODUCTION = True  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="production"):
        call_command("demo_lab", "--traces", str(tmp_path))


def _pending_at(job: dict[str, Any], runs: list[tuple[datetime, datetime | None]], at: datetime) -> bool:
    """Whether ``job`` waited at ``at``: submitted, not over, and on no GPU then."""
    if job["first_submitted_at"] is None or job["first_submitted_at"] > at:
        return False
    if job["ended_at"] is not None and job["ended_at"] <= at:
        return False
    return not any(lo <= at and (hi is None or hi > at) for lo, hi in runs)


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_hasher")
def test_replayed_history_queue_idle_reasons_and_demand_agree(tmp_path: Path, sim_state: None) -> None:
    """The history's present is a busy lab, not a backlog; an hour with idle GPUs for lack of
    demand had no job of that type waiting that fitted them; and the capacity page's demand is
    what ran plus what waited."""
    from django.db import models

    call_command(
        "demo_lab",
        "--traces",
        str(tmp_path),
        *FAST,
        "--no-queue",
        "--no-bookings",
        stdout=open(tmp_path / "o.txt", "w"),  # noqa: SIM115
    )
    cluster = Cluster.objects.get(name=CLUSTER_NAME)
    capacity, type_of_node, jobs, runs = _lab_facts(cluster)

    # 0. Every batch job carries a runtime prediction: history jobs what the portal's predictor
    #    said when they were submitted (learnt from the jobs finished by then), waiting ones now.
    batch = Job.objects.filter(cluster=cluster, kind=Job.Kind.BATCH)
    assert batch.exists()
    assert not batch.filter(predicted_p50_s__isnull=True).exists()
    assert not batch.filter(predicted_p90_s__lt=models.F("predicted_p50_s")).exists()
    _assert_queue_at_now_drains(cluster, capacity)
    _assert_no_demand_means_nothing_waited(cluster, jobs, runs, type_of_node)
    _assert_demand_is_running_plus_waiting(cluster, capacity, jobs, runs)


def _lab_facts(cluster: Cluster) -> tuple[Any, dict[str, str], dict[int, Any], dict[int, list[Any]]]:
    """GPUs per type, the type of each node, every job, and each job's allocation periods."""
    from collections import Counter, defaultdict

    capacity: Counter[str] = Counter()
    type_of_node: dict[str, str] = {}
    for name, type_name, gpus in Node.objects.filter(cluster=cluster).values_list(
        "name", "gpu_type__name", "gpu_count"
    ):
        capacity[type_name] += gpus
        type_of_node[name] = type_name
    jobs = {
        j["id"]: j
        for j in Job.objects.filter(cluster=cluster).values(
            "id", "kind", "gpu_type__name", "gpu_count", "first_submitted_at", "ended_at", "status", "payload"
        )
    }
    runs: dict[int, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for job_id, period in Allocation.objects.filter(job__cluster=cluster).values_list("job_id", "period"):
        runs[job_id].append((period.lower, period.upper))
    return capacity, type_of_node, jobs, runs


def _assert_queue_at_now_drains(cluster: Cluster, capacity: Any) -> None:
    """1. The queue at now: every waiting job can start, and the work waiting per type drains in
    under two days of that type's GPUs (the backlog bug left weeks of phantom work)."""
    from collections import Counter

    from scheduling.snapshots import job_startability

    pending = Job.objects.filter(cluster=cluster, status=Job.Status.PENDING)
    assert Job.objects.filter(cluster=cluster, status=Job.Status.RUNNING).exists()
    backlog: Counter[str] = Counter()
    for job in pending:
        assert job_startability(job) is None, job
        backlog[job.gpu_type.name] += job.gpu_count * job.payload["sim_runtime_s"] / 3600.0
    for type_name, gpu_hours in backlog.items():
        assert gpu_hours / capacity[type_name] < 48, (type_name, gpu_hours, capacity[type_name])
    assert pending.count() < sum(capacity.values())


def _assert_no_demand_means_nothing_waited(
    cluster: Cluster, jobs: dict[int, Any], runs: dict[int, list[Any]], type_of_node: dict[str, str]
) -> None:
    """2. No idle GPU is "no demand" while a job of its type waited that it (with the others) fitted."""
    from collections import Counter

    from scheduling.models import EngineRound

    checked = 0
    for rnd in EngineRound.objects.filter(cluster=cluster, decisions__has_key="idle_nodes"):
        no_demand: Counter[str] = Counter()
        for node, reasons in rnd.decisions["idle_nodes"].items():
            no_demand[type_of_node[node]] += reasons.get("no_demand", 0)
        for job_id, job in jobs.items():
            if job["kind"] != Job.Kind.BATCH or no_demand[job["gpu_type__name"]] < job["gpu_count"]:
                continue
            checked += 1
            assert not _pending_at(job, runs[job_id], rnd.started_at), (rnd.started_at, job, no_demand)
    assert checked > 0


def _assert_demand_is_running_plus_waiting(
    cluster: Cluster, capacity: Any, jobs: dict[int, Any], runs: dict[int, list[Any]]
) -> None:
    """3. Demand per type and hour = GPUs running (allocations) + GPUs of jobs waiting, hour means."""
    from forecasting.selectors import demand_series_get

    series = demand_series_get(cluster_id=cluster.pk, end_at=NOW, history_days=7)
    hours = [NOW - timedelta(hours=h) for h in (1, 5, 24, 24 * 3, 24 * 6)]
    steps = 60
    for type_name in capacity:
        demand = series.get(("gpu_type", type_name))
        if demand is None:
            continue
        for start in hours:
            expected = 0.0
            for i in range(steps):
                at = start + timedelta(seconds=(i + 0.5) * 3600 / steps)
                for job_id, job in jobs.items():
                    if job["gpu_type__name"] != type_name:
                        continue
                    running = sum(1 for lo, hi in runs[job_id] if lo <= at and (hi is None or hi > at))
                    waiting = _pending_at(job, runs[job_id], at)
                    expected += running + (job["gpu_count"] if waiting else 0)
            expected /= steps
            actual = float(demand.loc[start.replace(tzinfo=None)])
            # sampled each minute: a job starting or ending inside a minute moves it by at most its size
            assert actual == pytest.approx(expected, abs=max(1.0, 0.05 * expected)), (type_name, start)
