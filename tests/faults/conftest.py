"""The fault suite's stack: its own PostgreSQL and Redis, gunicorn, a Celery worker and beat.

Started once per module (``stack``), on free loopback ports, from the same code and settings a
deployment runs (``DJANGO_ENV=production``; plain HTTP on loopback).  Tests stop and restart
the servers and kill the worker; each test leaves every part running again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faults.servers import BIN, ROOT, PostgresServer, Process, RedisServer, free_port, wait_for

DB_NAME = "berth_faults"
ROUND_INTERVAL_S = 2
RETRY_FOR_S = 60.0  # an in-doubt write is retried this long (the outages last seconds)
RETRY_PAUSE_S = 0.3  # between two tries (shorter than the 503's Retry-After: a test wants it done)


@dataclass
class Stack:
    pg: PostgresServer
    redis: RedisServer
    web: Process
    worker: Process
    beat: Process
    base_url: str
    seed: dict[str, Any]
    env: dict[str, str]
    log_dir: Path

    @property
    def engine_redis_url(self) -> str:
        return self.env["BERTH_ENGINE_REDIS_URL"]

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.pg.port,
            user="berth",
            password="berth",
            dbname=DB_NAME,
            connect_timeout=5,
        ) as conn:
            return conn.execute(query, params).fetchall()

    def api(self, token_index: int = 0) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.seed['tokens'][token_index]}"
        return session

    def login(self) -> dict[str, str]:
        """Sign in through the login form; returns the Cookie header of the session.

        The cookies are Secure (production settings), so they are sent by hand over plain HTTP.
        """
        session = requests.Session()
        page = session.get(f"{self.base_url}/login/", timeout=10)
        csrf = page.cookies.get("csrftoken") or session.cookies.get("csrftoken")
        answer = session.post(
            f"{self.base_url}/login/",
            data={
                "username": self.seed["username"],
                "password": self.seed["password"],
                "csrfmiddlewaretoken": csrf,
            },
            headers={"Cookie": f"csrftoken={csrf}", "Referer": f"{self.base_url}/login/"},
            allow_redirects=False,
            timeout=10,
        )
        assert answer.status_code == 302, (answer.status_code, answer.text[:300])
        sessionid = answer.cookies.get("sessionid")
        assert sessionid
        return {"Cookie": f"sessionid={sessionid}; csrftoken={csrf}"}

    def dashboard(self, cookie: dict[str, str]) -> requests.Response:
        return requests.get(f"{self.base_url}/", headers=cookie, timeout=10, allow_redirects=False)

    def rounds(self) -> int:
        return int(self.sql("SELECT count(*) FROM scheduling_engineround WHERE error = ''")[0][0])

    def tails(self) -> str:
        """The last lines of every process's log, and which are still running (for failures)."""
        return "\n".join(
            f"---- {p.name} ({'running' if p.is_running() else 'exited'}):\n{p.tail(40)}"
            for p in (self.web, self.worker, self.beat)
        )

    def assert_up(self) -> None:
        for process in (self.web, self.worker, self.beat):
            assert process.is_running(), f"{process.name} exited:\n{process.tail()}"


def _run(argv: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{out.stdout.decode()[-2000:]}\n{out.stderr.decode()[-4000:]}")
    return out.stdout.decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("fault-stack")
    pg, redis_server = PostgresServer(), RedisServer()
    processes: list[Process] = []
    try:
        pg.start()
        database_url = pg.bootstrap(db=DB_NAME)
        redis_server.start()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "BERTH_", "CELERY_"))},
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "DJANGO_ENV": "production",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECURE_SSL_REDIRECT": "0",
            "DJANGO_SECRET_KEY": "fault-suite-only-" + "s" * 50,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
            "DATABASE_URL": database_url,
            "REDIS_URL": f"{redis_server.url}/0",
            "CELERY_BROKER_URL": f"{redis_server.url}/1",
            "CELERY_RESULT_BACKEND": f"{redis_server.url}/1",
            "BERTH_ENGINE_REDIS_URL": f"{redis_server.url}/2",
            "BERTH_ENGINE_ROUND_INTERVAL_S": str(ROUND_INTERVAL_S),
            "BERTH_ENGINE_QUEUED_TTL_S": "5",
            "BERTH_ENGINE_ROUND_SOFT_TIME_LIMIT_S": "20",
            "BERTH_ENGINE_ROUND_TIME_LIMIT_S": "25",
            "CELERY_VISIBILITY_TIMEOUT_S": "30",
            "C_FORCE_ROOT": "1",
            "LOG_LEVEL": "WARNING",
        }
        _run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], env)
        seed = json.loads(_run([sys.executable, "-m", "tests.faults.seed"], env).strip().splitlines()[-1])
        port = free_port()
        web = Process(
            "web",
            [
                str(BIN / "gunicorn"),
                "portal.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--worker-class",
                "gthread",
                "--threads",
                "4",
                "--timeout",
                "60",
                "--log-level",
                "warning",
            ],
            env=env,
            log_dir=log_dir,
        )
        worker = Process(
            "worker",
            [
                str(BIN / "celery"),
                "-A",
                "portal",
                "worker",
                "--pool=prefork",
                "--concurrency=1",
                "--loglevel=INFO",
                "--hostname",
                f"faults-{port}@%h",
                "--without-gossip",
                "--without-mingle",
            ],
            env=env,
            log_dir=log_dir,
        )
        beat = Process(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "portal",
                "beat",
                "--loglevel=INFO",
                "--scheduler",
                "django_celery_beat.schedulers:DatabaseScheduler",
                "--pidfile",
                str(log_dir / "beat.pid"),
            ],
            env=env,
            log_dir=log_dir,
        )
        processes = [web, worker, beat]
        for process in processes:
            process.start()
        base_url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: requests.get(f"{base_url}/login/", timeout=5).status_code == 200,
            timeout_s=120,
            what="gunicorn",
        )
        stack = Stack(
            pg=pg,
            redis=redis_server,
            web=web,
            worker=worker,
            beat=beat,
            base_url=base_url,
            seed=seed,
            env=env,
            log_dir=log_dir,
        )
        wait_for(lambda: stack.rounds() >= 1, timeout_s=180, what=f"a first engine round\n{worker.tail()}")
        yield stack
    finally:
        for process in reversed(processes):
            process.stop()
        redis_server.destroy()
        pg.destroy()


# ---- load: clients that keep using the portal while the faults happen ----


@dataclass
class Outcome:
    at: float
    kind: str
    status: int  # 0: no HTTP answer (connection refused, timeout)
    content_type: str
    body: str
    retry_after: str | None
    note: str = ""
    started: float = 0.0  # when the request was sent (``at``: when its answer came)
    is_final: bool = True  # False: an in-doubt write (503 or no answer) that was sent again
    is_replayed: bool = False  # the answer was the stored one of an earlier try (Idempotent-Replayed)


@dataclass
class Load:
    """Client threads booking, submitting and reading availability in a closed loop.

    Every booking carries a unique note and its own hour (8 per hour on 16 GPUs: capacity never
    refuses one), so the database can be compared with the answers afterwards.  Every write
    carries its own ``Idempotency-Key``; a write whose answer is in doubt (a 503 or no answer:
    its COMMIT may have reached PostgreSQL as it died) is sent again with the same key until it
    gets a real answer, as the ``berth`` CLI does, so no write stays in doubt.
    """

    stack: Stack
    label: str
    threads: int = 3
    is_submitting: bool = True  # every fourth iteration also submits a 20 s job
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: int = 0
    _workers: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base = datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)

    def _next(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    def _record(
        self,
        kind: str,
        response: requests.Response | None,
        note: str = "",
        *,
        started: float,
        is_final: bool = True,
    ) -> None:
        outcome = Outcome(
            started=started,
            at=time.monotonic(),
            kind=kind,
            status=response.status_code if response is not None else 0,
            content_type=response.headers.get("Content-Type", "") if response is not None else "",
            body=response.text[:500] if response is not None else "",
            retry_after=response.headers.get("Retry-After") if response is not None else None,
            note=note,
            is_final=is_final,
            is_replayed=response is not None and response.headers.get("Idempotent-Replayed") == "true",
        )
        with self._lock:
            self.outcomes.append(outcome)

    def _write(
        self, session: requests.Session, kind: str, method: str, url: str, body: Any, note: str
    ) -> None:
        """One write, sent again with the same Idempotency-Key while its answer is in doubt."""
        key = f"{note}-{kind}"
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            started = time.monotonic()
            try:
                response = session.request(
                    method, url, json=body, headers={"Idempotency-Key": key}, timeout=15
                )
            except requests.RequestException:
                response = None
            is_in_doubt = response is None or response.status_code == 503
            is_final = not is_in_doubt or time.monotonic() > deadline
            self._record(kind, response, note, started=started, is_final=is_final)
            if is_final:
                return
            time.sleep(RETRY_PAUSE_S)

    def _client(self, index: int) -> None:
        session = self.stack.api(index % len(self.stack.seed["tokens"]))
        seed = self.stack.seed
        url = self.stack.base_url
        while not self._stop.is_set():
            n = self._next()
            note = f"{self.label}-{n}"
            start = self.base + timedelta(hours=n // 8)
            calls = [
                (
                    "booking",
                    "POST",
                    "/api/v1/bookings/",
                    {
                        "project": seed["project"],
                        "gpu_type": seed["gpu_type"],
                        "cluster": seed["cluster"],
                        "gpu_count": 1,
                        "start_at": start.isoformat(),
                        "end_at": (start + timedelta(hours=1)).isoformat(),
                        "note": note,
                    },
                ),
                (
                    "availability",
                    "GET",
                    f"/api/v1/availability/?gpu_type={seed['gpu_type']}&start={start.isoformat()}"
                    f"&end={(start + timedelta(hours=24)).isoformat()}&step=1800".replace("+", "%2B"),
                    None,
                ),
            ]
            if self.is_submitting and n % 4 == 0:
                calls.append(
                    (
                        "job",
                        "POST",
                        "/api/v1/jobs/",
                        {
                            "name": note,
                            "project": seed["project"],
                            "cluster": seed["cluster"],
                            "gpu_type": seed["gpu_type"],
                            "gpu_count": 1,
                            "requested_s": 120,
                            "payload": {"command": "sleep 20", "sim_runtime_s": 20},
                        },
                    )
                )
            for kind, method, path, body in calls:
                if kind in ("booking", "job"):
                    self._write(session, kind, method, url + path, body, note)
                    continue
                started = time.monotonic()
                try:
                    response = session.request(method, url + path, json=body, timeout=15)
                except requests.RequestException:
                    response = None
                self._record(kind, response, started=started)
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for i in range(self.threads):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join(timeout=RETRY_FOR_S + 30)

    def between(self, t0: float, t1: float) -> list[Outcome]:
        """Outcomes answered in [t0, t1)."""
        with self._lock:
            return [o for o in self.outcomes if t0 <= o.at < t1]

    def sent_between(self, t0: float, t1: float) -> list[Outcome]:
        """Outcomes of requests sent and answered within [t0, t1)."""
        with self._lock:
            return [o for o in self.outcomes if t0 <= o.started and o.at < t1]


def assert_no_server_error(
    outcomes: list[Outcome], *, allow_503: bool, detail: Callable[[], str] | None = None
) -> None:
    """No answer is a 500 (or any 5xx but a JSON 503 with Retry-After when allowed); every answer came.

    ``detail`` (the stack's log tails) is added to a failure: the server logs say why it answered so.
    """
    missing = [o for o in outcomes if o.status == 0]
    assert not missing, f"{len(missing)} requests got no answer: {missing[:3]}"
    for o in outcomes:
        if o.status < 500:
            continue
        assert allow_503, (o.kind, o.status, o.body[:300], detail() if detail else "")
        assert o.status == 503, (o.kind, o.status, o.body[:300])
        assert o.content_type.startswith("application/json"), o
        assert set(json.loads(o.body)) == {"message", "fields"}, o.body
        assert o.retry_after is not None, o
        assert int(o.retry_after) > 0, o
        for secret in ("Traceback", "redis://", "postgres://", "SECRET_KEY", "berth:berth"):
            assert secret not in o.body


def assert_writes_match(stack: Stack, load: Load) -> None:
    """Every acknowledged write (a final 201, first answer or replay) is in the database exactly
    once, with its Idempotency-Key stored beside it; nothing else is; no write is left in doubt.

    A write whose COMMIT reached PostgreSQL just as it was killed is stored while its answer is
    lost (the client sees a 503 or no answer).  The load sends such a write again with the same
    key: the retry finds the key (stored in the write's own transaction) and answers the stored
    201 instead of writing twice, or finds none and writes.  So the answers and the rows agree
    exactly, even across a crash.
    """
    for kind, table, column in (("booking", "scheduling_booking", "note"), ("job", "scheduling_job", "name")):
        finals = [o for o in load.outcomes if o.kind == kind and o.is_final]
        in_doubt = [o.note for o in finals if o.status in (0, 503)]
        assert not in_doubt, f"{kind}: still in doubt after the retries: {in_doubt[:5]}"
        acknowledged = [o.note for o in finals if o.status == 201]
        refused = {o.note for o in finals if o.status != 201}
        rows = [
            r[0]
            for r in stack.sql(
                f"SELECT {column} FROM {table} WHERE {column} LIKE %s",  # noqa: S608 (names above, value a parameter)
                (f"{load.label}-%",),
            )
        ]
        assert len(acknowledged) == len(set(acknowledged))
        assert len(rows) == len(set(rows)), f"{kind}: duplicated {len(rows) - len(set(rows))}"
        assert sorted(rows) == sorted(acknowledged), (
            f"{kind}: lost {sorted(set(acknowledged) - set(rows))[:5]},"
            f" not acknowledged but written {sorted(set(rows) - set(acknowledged))[:5]}"
        )
        assert not refused & set(rows)
        # Each stored write has its key, and each stored key its write (one transaction).
        keys = {
            r[0].removesuffix(f"-{kind}")
            for r in stack.sql(
                "SELECT key FROM scheduling_idempotencykey WHERE key LIKE %s AND status_code = 201",
                (f"{load.label}-%-{kind}",),
            )
        }
        assert keys == set(rows), (sorted(keys - set(rows))[:5], sorted(set(rows) - keys)[:5])
    overlaps = stack.sql(
        """
        SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
          ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
         WHERE a.state <> 'released' AND b.state <> 'released'
        """
    )[0][0]
    assert overlaps == 0
