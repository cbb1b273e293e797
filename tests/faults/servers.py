"""Throwaway PostgreSQL and Redis servers, and the portal's processes, for the fault suite.

Each server is started from the Debian binaries on a free loopback port in a directory of its
own, like ``scripts/services.sh`` does for the project-local ones; the shared servers of the
machine are never touched.  As root, PostgreSQL runs as the ``postgres`` account
(``runuser -u postgres``): it refuses to run as root.  Processes (gunicorn, the Celery worker
and beat) are started in sessions of their own, so a test can kill one with its children.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # the thing polled may be down for a while
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(interval_s)
    more = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last error: {last_error}){more}")


def _is_root() -> bool:
    return os.geteuid() == 0


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: p.parts[-3])
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
    return found[-1].parent


class PostgresServer:
    """A PostgreSQL cluster of its own (``initdb``) on a free loopback port, with role ``berth``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.bin = _pg_bin()
        # /var/tmp: the postgres account must reach it when the tests run as root.
        self.dir = Path(tempfile.mkdtemp(prefix="berth-fault-pg-", dir="/var/tmp"))
        self.data = self.dir / "data"
        if _is_root():
            shutil.chown(self.dir, "postgres", "postgres")
        self._as_pg(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"]
        )

    def _as_pg(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        if _is_root():
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, timeout=120, **kwargs)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=100"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._as_pg(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "server.log"),
                "-w",
                "-o",
                options,
                "start",
            ]
        )

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: open connections are cut, like a database host going away."""
        self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def psql(self, sql: str, *, db: str = "postgres") -> str:
        out = subprocess.run(
            ["psql", f"host=127.0.0.1 port={self.port} user=postgres dbname={db}", "-qtAc", sql],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return out.stdout.decode().strip()

    def bootstrap(self, *, db: str) -> str:
        """Role ``berth`` and database ``db`` with btree_gist; returns its URL."""
        self.psql("CREATE ROLE berth LOGIN PASSWORD 'berth' CREATEDB")
        self.psql(f"CREATE DATABASE {db} OWNER berth")
        self.psql("CREATE EXTENSION IF NOT EXISTS btree_gist", db=db)
        return f"postgres://berth:berth@127.0.0.1:{self.port}/{db}"

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """``redis-server`` on a free loopback port, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="berth-fault-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=(self.dir / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_for(self.ping, timeout_s=20, what="redis-server to answer")

    def ping(self) -> bool:
        import redis

        return bool(redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5).ping())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # like the host going away: no clean shutdown
            self.proc.wait(timeout=20)
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Process:
    """One of the portal's processes (gunicorn, worker, beat) in a session of its own."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_9(self) -> None:
        """SIGKILL to the whole process group: the main process and every child at once."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        if not self.is_running():
            return
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
