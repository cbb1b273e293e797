"""`python -m bench.round` at a tiny size: the JSON contract of DESIGN §8 and what the rounds left.

The bench creates, fills and (without ``--keep-db``) drops a database of its own on the server
of ``DATABASE_URL``; here it keeps it, so the test reads the persisted state itself (psycopg,
not the bench's own check) and drops it afterwards.  Real PostgreSQL, real Redis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
PHASES = {"backend_snapshot", "reconcile", "snapshot_build", "plan", "persist", "apply"}

pytestmark = pytest.mark.slow


def _connect(dbname: str) -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"],
        dbname=dbname,
        autocommit=True,
    )


@pytest.fixture
def bench_db() -> str:
    name = f"{settings.DATABASES['default']['NAME']}_round"[:60]
    yield name
    with _connect("postgres") as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_round_bench_json_and_persisted_state(tmp_path: Path, bench_db: str) -> None:
    db = settings.DATABASES["default"]
    base_url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    out = tmp_path / "round.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": base_url, "REDIS_URL": settings.REDIS_URL}
    env.pop("BERTH_ENGINE_REDIS_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.round",
            "--nodes",
            "6",
            "--gpus-per-node",
            "4",
            "--running",
            "4",
            "--pending",
            "40",
            "--history",
            "30",
            "--rounds",
            "3",
            "--step-s",
            "600",
            "--db-name",
            bench_db,
            "--keep-db",
            "--alternatives-bookings",
            "400",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert {"round_ms_p50", "round_ms_p99", "phases_ms"} <= set(data)
    assert set(data["phases_ms"]) == PHASES
    assert 0 < data["round_ms_p50"] <= data["round_ms_p99"]
    assert data["rounds"] == len(data["per_round"]) == 3
    for r in data["per_round"]:
        assert set(r["phases_ms"]) == PHASES
        # The phases are parts of the round: together they do not exceed it.
        assert sum(r["phases_ms"].values()) <= r["round_ms"] * 1.01
        # CPU time of the bench process and of the round's PostgreSQL backend (local server).
        assert r["cpu_ms"] > 0
        assert r["db_cpu_ms"] >= 0
    assert data["cpu_ms_p50"] <= data["cpu_ms_p99"]
    assert data["db_cpu_ms_p50"] <= data["db_cpu_ms_p99"]
    assert data["state"] == dict.fromkeys(data["state"], 0)
    assert data["pending"] == 40
    # The alternatives phase: a calendar of its own, every timed search one the calendar refuses.
    alternatives = data["alternatives"]
    assert alternatives["bookings"] == 400
    assert alternatives["calls"] == 5 * 3 * 4
    assert 1 <= alternatives["refused_calls"] <= alternatives["calls"]
    assert 0 < alternatives["alternatives_ms_p50"] <= alternatives["alternatives_ms_p99"]

    with _connect(bench_db) as conn:
        rounds = conn.execute("SELECT count(*) FROM scheduling_engineround WHERE error = ''").fetchone()[0]
        assert rounds == 3
        # The free GPUs were used: something started, every start has its GPUs, once.
        started = conn.execute(
            "SELECT count(*) FROM scheduling_auditevent WHERE verb = 'job.start'"
        ).fetchone()[0]
        assert started >= 1
        wrong = conn.execute(
            """
            SELECT j.id FROM scheduling_job j
              LEFT JOIN scheduling_allocation a ON a.job_id = j.id AND a.state = 'active'
             WHERE j.status IN ('running', 'starting')
             GROUP BY j.id, j.gpu_count HAVING count(a.id) <> j.gpu_count
            """
        ).fetchall()
        assert wrong == []
        unexplained = conn.execute(
            "SELECT count(*) FROM scheduling_job WHERE status = 'pending' AND pending_reason = ''"
        ).fetchone()[0]
        assert unexplained == 0
        overlaps = conn.execute(
            """
            SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
             WHERE a.state <> 'released' AND b.state <> 'released'
            """
        ).fetchone()[0]
        assert overlaps == 0
        # Every start is in the audit log with its allocations (events written in batches).
        creates = conn.execute(
            "SELECT count(*) FROM scheduling_auditevent WHERE verb = 'allocation.create'"
        ).fetchone()[0]
        assert creates >= started
    assert urlsplit(base_url).path == f"/{db['NAME']}"  # the suite's own database was not touched
