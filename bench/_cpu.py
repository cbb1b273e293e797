"""CPU accounting of a load benchmark (Linux /proc; absent elsewhere), used by `bench.api`."""

from __future__ import annotations

import os

# ---- CPU accounting (Linux /proc; absent elsewhere) ----
# Throughput on a shared machine says little; CPU seconds per request do not depend on what
# else runs.  The bench reports, per phase, the CPU its own client processes, the server's
# process tree (``--server-pid``) and the database's backends spent per request.


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_pids(root: int) -> list[int]:
    """``root`` and its descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _db_backend_pids() -> list[int]:
    """The PostgreSQL backends serving this database (a local server only)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [int(r[0]) for r in cur.fetchall()]


class CpuMeter:
    """CPU seconds of the server's process tree and the database backends over a phase."""

    def __init__(self, server_pid: int | None, with_db: bool) -> None:
        self.server_pid = server_pid
        self.with_db = with_db and os.path.isdir("/proc")
        self._start: dict[str, dict[int, float]] = {}

    def _sample(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        if self.server_pid is not None:
            out["server"] = {p: _proc_cpu_s(p) for p in _tree_pids(self.server_pid)}
        if self.with_db:
            out["db"] = {p: _proc_cpu_s(p) for p in _db_backend_pids()}
        return out

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        end = self._sample()
        return {
            name: sum(max(0.0, cpu - self._start.get(name, {}).get(pid, 0.0)) for pid, cpu in pids.items())
            for name, pids in end.items()
        }
