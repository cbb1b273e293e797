"""Load benchmark of the REST API against a running server on loopback (DESIGN §8).

    python -m bench.api --url http://127.0.0.1:8000 --setup --out api.json

``--setup`` creates (idempotently, through the Django ORM on the same ``DATABASE_URL`` the
server uses) a dedicated cluster ``bench`` of ``--bench-nodes`` × 8 GPUs of type ``BENCH``, a
project and ``--clients`` users with API tokens.  Without it, pass ``--token`` and the names
of an existing GPU type / project.

Phases, each a closed loop of ``--clients`` concurrent clients (separate processes, so the
client's GIL is not the bottleneck) for ``--duration-s`` seconds:

- ``availability``: GET /api/v1/availability/ over a one-day window in 30-minute steps;
- ``booking_create``: POST /api/v1/bookings/, 1 GPU for 1 h at spread-out future hours
  (201 counts as success; 409 — the nearest GPUs were just taken — is counted separately);
- ``bookings_list``: GET /api/v1/bookings/?mine=true;
- ``refused_booking``: POST /api/v1/bookings/ for 8 GPUs in a window the bench filled first
  (``--setup``; 70 days ahead, past the hours booking_create walks), so every request is
  refused: a 409 with the nearest alternatives, or a 429 once a client passes the
  refused-booking limit (``BERTH_REFUSED_BOOKING_RATE``);
- ``mixed``: one client sends those refused bookings while the others read availability;
  ``availability`` and ``attacker`` are reported apart (the others' p99 is the number);
- ``conflict_storm``: all clients book the same window at once, more GPUs than exist.

``double_bookings`` is then read from the database: pairs of overlapping live allocations of
one GPU (the exclusion constraint should make it 0) plus GPUs granted beyond capacity in the
storm window.  Only loopback URLs are accepted.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from bench._cpu import CpuMeter
from scheduling.stats import quantile

BENCH_TYPE = "BENCH"
BENCH_CLUSTER = "bench"
BENCH_PROJECT = "bench"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    tokens: tuple[str, ...]
    gpu_type: str
    project: str
    cluster: str
    full_start: str = ""  # a window every GPU is booked in (refused_booking, mixed)
    full_end: str = ""


def setup_bench_lab(*, clients: int, nodes: int) -> tuple[list[str], str, str, str]:
    """Create the bench cluster, project, users and tokens; return (tokens, type, project, cluster)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from portal.accounts.models import Membership, Project
    from scheduling.models import Allocation, Booking, Cluster, Gpu, GpuType, Node

    user_model = get_user_model()
    gpu_type, _ = GpuType.objects.get_or_create(
        name=BENCH_TYPE, defaults={"memory_gib": 80.0, "precisions": ["fp32", "bf16"]}
    )
    cluster, _ = Cluster.objects.get_or_create(name=BENCH_CLUSTER, defaults={"backend": "simulator"})
    for i in range(nodes):
        node, created = Node.objects.get_or_create(
            cluster=cluster, name=f"bench-n{i:03d}", defaults={"gpu_type": gpu_type, "gpu_count": 8}
        )
        if created:
            Gpu.objects.bulk_create(Gpu(node=node, index=j) for j in range(8))
    project, _ = Project.objects.get_or_create(slug=BENCH_PROJECT, defaults={"name": "Bench"})
    # Earlier runs' bookings would make every window look full: clear the bench cluster.
    Allocation.objects.filter(gpu__node__cluster=cluster).delete()
    Booking.objects.filter(cluster=cluster).delete()
    tokens = []
    for i in range(clients):
        user, _ = user_model.objects.get_or_create(username=f"bench-{i:03d}")
        Membership.objects.get_or_create(user=user, project=project)
        token, _ = Token.objects.get_or_create(user=user)
        tokens.append(token.key)
    return tokens, BENCH_TYPE, BENCH_PROJECT, BENCH_CLUSTER


def count_double_bookings(*, cluster: str, storm_start: datetime, storm_end: datetime) -> tuple[int, int]:
    """Overlapping live allocation pairs on one GPU, and GPUs granted in the storm window."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FROM scheduling_allocation a
            JOIN scheduling_allocation b ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
            JOIN scheduling_gpu g ON g.id = a.gpu_id
            JOIN scheduling_node n ON n.id = g.node_id
            JOIN scheduling_cluster c ON c.id = n.cluster_id
            WHERE c.name = %s
            """,
            [cluster],
        )
        overlaps = int(cur.fetchone()[0])
        cur.execute(
            """
            SELECT count(DISTINCT a.id) FROM scheduling_allocation a
            JOIN scheduling_gpu g ON g.id = a.gpu_id
            JOIN scheduling_node n ON n.id = g.node_id
            JOIN scheduling_cluster c ON c.id = n.cluster_id
            WHERE c.name = %s AND a.period && tstzrange(%s, %s, '[)')
            """,
            [cluster, storm_start, storm_end],
        )
        granted = int(cur.fetchone()[0])
    return overlaps, granted


# ---- client processes ----


class _KeepAlive:
    """A minimal HTTP/1.1 keep-alive client for the measuring loop.

    ``http.client`` parses every response's headers with the ``email`` package, which cost the
    bench's clients about a third of what the server spent per availability request, on the
    same cores.  This sends prebuilt requests and reads ``Content-Length`` bodies; it
    reconnects when the server closes the connection.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buffer = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.buffer = sock, b""
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def _read_more(self, sock: socket.socket) -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk

    def request(self, raw: bytes) -> int:
        """Send one request; return the status once the whole response is read.

        A kept connection the server closed while idle (gunicorn's keep-alive timeout) is
        opened again and the request sent once more: the server never saw it.
        """
        reused = self.sock is not None
        try:
            return self._exchange(raw)
        except OSError:  # ConnectionError included
            self.close()
            if not reused:
                raise
        return self._exchange(raw)

    def _exchange(self, raw: bytes) -> int:
        sock = self.sock or self._connect()
        sock.sendall(raw)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._read_more(sock)
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4 :]
        lines = head.split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
            elif name == "transfer-encoding":
                raise ConnectionError("chunked responses are not expected here")
        while len(self.buffer) < length:
            self._read_more(sock)
        self.buffer = self.buffer[length:]
        if close:
            self.close()
        return status


def _raw_request(host: str, method: str, path: str, token: str, body: dict[str, Any] | None) -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Token {token}\r\n"
        "Accept: application/json\r\n"
    )
    if body is None:
        return (head + "\r\n").encode()
    payload = json.dumps(body).encode()
    return (
        head + f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, token: str, body: dict[str, Any] | None
) -> int:
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    response.read()
    return response.status


def _client_loop(
    args: tuple[Target, str, int, float, float, int],
) -> tuple[list[float], dict[int, int], float, str]:
    target, phase, client, start_wall, duration_s, base_hour = args
    token = target.tokens[client % len(target.tokens)]
    conn = _KeepAlive(target.host, target.port, timeout=30)
    host = f"{target.host}:{target.port}"
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    day0 = datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=base_hour)
    while time.time() < start_wall:
        time.sleep(0.001)
    deadline = start_wall + duration_s
    cpu0 = time.process_time()
    i = 0
    role = phase
    if phase == "mixed":
        role = "refused_booking" if client == 0 else "availability"
        if client == 0:  # the attacker signs in as a user of its own: its limit is its own
            token = target.tokens[-1]
    while time.time() < deadline:
        if role == "refused_booking":
            method, path = "POST", "/api/v1/bookings/"
            body = {
                "project": target.project,
                "gpu_type": target.gpu_type,
                "cluster": target.cluster,
                "gpu_count": 8,
                "start_at": target.full_start,
                "end_at": target.full_end,
            }
        elif role == "availability":
            start = day0 + timedelta(hours=(client + i) % 48)
            query = urlencode(
                {
                    "gpu_type": target.gpu_type,
                    "start": start.isoformat(),
                    "end": (start + timedelta(hours=24)).isoformat(),
                    "step": 1800,
                }
            )
            method, path, body = "GET", f"/api/v1/availability/?{query}", None
        elif phase == "bookings_list":
            method, path, body = "GET", "/api/v1/bookings/?mine=true", None
        else:  # booking_create: each client walks its own hours, so most requests can succeed
            start = day0 + timedelta(hours=1 + (i * 7 + client * 13) % 1500)
            method, path = "POST", "/api/v1/bookings/"
            body = {
                "project": target.project,
                "gpu_type": target.gpu_type,
                "cluster": target.cluster,
                "gpu_count": 1,
                "start_at": start.isoformat(),
                "end_at": (start + timedelta(hours=1)).isoformat(),
            }
        raw = _raw_request(host, method, path, token, body)
        t0 = time.perf_counter()
        try:
            code = conn.request(raw)
        except (OSError, ValueError, IndexError):
            conn.close()
            code = 0
        latencies.append((time.perf_counter() - t0) * 1000.0)
        statuses[code] = statuses.get(code, 0) + 1
        i += 1
    cpu = time.process_time() - cpu0
    conn.close()
    return latencies, statuses, cpu, role


def _storm_client(args: tuple[Target, int, float, str, str, int]) -> int:
    target, client, start_wall, start_at, end_at, gpu_count = args
    conn = http.client.HTTPConnection(target.host, target.port, timeout=60)
    body = {
        "project": target.project,
        "gpu_type": target.gpu_type,
        "cluster": target.cluster,
        "gpu_count": gpu_count,
        "start_at": start_at,
        "end_at": end_at,
    }
    while time.time() < start_wall:
        time.sleep(0.0005)
    try:
        return _request(conn, "POST", "/api/v1/bookings/", target.tokens[client % len(target.tokens)], body)
    finally:
        conn.close()


def run_phase(
    pool: Any,
    target: Target,
    *,
    phase: str,
    clients: int,
    duration_s: float,
    base_hour: int,
    meter: CpuMeter | None = None,
) -> dict[str, Any]:
    start_wall = time.time() + 0.5
    jobs = [(target, phase, c, start_wall, duration_s, base_hour) for c in range(clients)]
    if meter is not None:
        meter.start()
    results = pool.map(_client_loop, jobs)
    used = meter.stop() if meter is not None else {}
    summary = _summarize([r[:3] for r in results], duration_s=duration_s, used=used)
    if phase == "mixed":
        for role in ("availability", "refused_booking"):
            mine = [r[:3] for r in results if r[3] == role]
            summary["attacker" if role == "refused_booking" else role] = _summarize(
                mine, duration_s=duration_s, used={}
            )
    return summary


def _summarize(
    results: list[tuple[list[float], dict[int, int], float]], *, duration_s: float, used: dict[str, float]
) -> dict[str, Any]:
    latencies = [x for lat, _, _ in results for x in lat]
    statuses: dict[str, int] = {}
    for _, st, _ in results:
        for code, n in st.items():
            statuses[str(code)] = statuses.get(str(code), 0) + n
    ok = sum(n for code, n in statuses.items() if code in {"200", "201"})
    n = max(1, len(latencies))
    cpu_ms = {"client": round(sum(cpu for _, _, cpu in results) / n * 1000.0, 3)}
    cpu_ms.update({name: round(seconds / n * 1000.0, 3) for name, seconds in used.items()})
    return {
        "rps": round(len(latencies) / duration_s, 1),
        "ok_rps": round(ok / duration_s, 1),
        "p50_ms": round(quantile(latencies, 0.50, method="nearest"), 2),
        "p99_ms": round(quantile(latencies, 0.99, method="nearest"), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else 0.0,
        "requests": len(latencies),
        "statuses": statuses,
        # CPU per request (ms): the bench's clients, the server's processes, the database.
        "cpu_ms_per_request": cpu_ms,
    }


def fill_window(target: Target, *, nodes: int) -> Target:
    """Book every GPU of the bench cluster in one 4-hour window, 70 days ahead, through the API.

    Bookings there are then always refused (409 with alternatives): the refused-booking phases
    measure that path.  Uses the first token; returns the target with the window.
    """
    start = (datetime.now(tz=UTC) + timedelta(days=70)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=4)
    conn = http.client.HTTPConnection(target.host, target.port, timeout=60)
    try:
        body = {
            "project": target.project,
            "gpu_type": target.gpu_type,
            "cluster": target.cluster,
            "gpu_count": 8,
            "start_at": start.isoformat(),
            "end_at": end.isoformat(),
            "note": "bench: fill the refused window",
        }
        codes = [_request(conn, "POST", "/api/v1/bookings/", target.tokens[0], body) for _ in range(nodes)]
        refused = _request(conn, "POST", "/api/v1/bookings/", target.tokens[0], body)
    finally:
        conn.close()
    if codes.count(201) != nodes or refused != 409:
        raise SystemExit(f"could not fill the refused window: {codes} then {refused}")
    return dataclasses.replace(target, full_start=start.isoformat(), full_end=end.isoformat())


def _print_phase(phase: str, result: dict[str, Any]) -> None:
    cpu = "  ".join(f"{k} {v:.2f}" for k, v in result["cpu_ms_per_request"].items())
    print(
        f"{phase:>16}: {result['rps']:8.1f} req/s  p50 {result['p50_ms']:7.2f} ms"
        f"  p99 {result['p99_ms']:7.2f} ms  {result['statuses']}  CPU ms/req: {cpu}"
    )
    for role in ("availability", "attacker") if phase == "mixed" else ():
        part = result[role]
        print(
            f"{'  ' + role:>16}: {part['rps']:8.1f} req/s  p50 {part['p50_ms']:7.2f} ms"
            f"  p99 {part['p99_ms']:7.2f} ms  {part['statuses']}"
        )


def _storm(
    pool: Any, target: Target, *, clients: int, per_client: int
) -> tuple[datetime, datetime, list[int]]:
    """Every client wants the same window at once, together asking for more than exists."""
    storm_start = (datetime.now(tz=UTC) + timedelta(days=80)).replace(minute=0, second=0, microsecond=0)
    storm_end = storm_start + timedelta(hours=2)
    start_wall = time.time() + 1.0
    codes = pool.map(
        _storm_client,
        [
            (target, c, start_wall, storm_start.isoformat(), storm_end.isoformat(), per_client)
            for c in range(clients)
        ],
    )
    return storm_start, storm_end, codes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="server base URL on loopback")
    parser.add_argument("--setup", action="store_true", help="create the bench cluster, users, tokens")
    parser.add_argument("--token", action="append", default=[], help="API token (repeatable)")
    parser.add_argument("--gpu-type", default=BENCH_TYPE)
    parser.add_argument("--project", default=BENCH_PROJECT)
    parser.add_argument("--cluster", default=BENCH_CLUSTER)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--bench-nodes", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--storm-clients", type=int, default=50)
    parser.add_argument(
        "--server-pid", type=int, default=None, help="server's main pid: report its CPU per request"
    )
    parser.add_argument(
        "--phases",
        default="availability,booking_create,bookings_list,refused_booking,mixed",
        help="comma-separated subset of availability, booking_create, bookings_list, refused_booking, mixed",
    )
    parser.add_argument("--out", required=True)
    return parser


def _report(
    args: argparse.Namespace,
    *,
    cluster: str,
    endpoints: dict[str, dict[str, Any]],
    storm: tuple[datetime, datetime],
    statuses: dict[str, int],
) -> int:
    """Count double bookings, print the storm and write the JSON; returns the double bookings."""
    storm_start, storm_end = storm
    storm_statuses = statuses
    capacity = args.bench_nodes * 8 if args.setup else 0
    per_client = 8
    double_bookings = 0
    granted_gpus = None
    if args.setup:
        overlaps, granted_gpus = count_double_bookings(
            cluster=cluster, storm_start=storm_start, storm_end=storm_end
        )
        double_bookings = overlaps + max(0, granted_gpus - capacity)
    result = {
        "url": args.url,
        "clients": args.clients,
        "duration_s": args.duration_s,
        "endpoints": endpoints,
        "conflict_storm": {
            "clients": args.storm_clients,
            "gpus_per_client": per_client,
            "capacity_gpus": capacity,
            "granted_gpus": granted_gpus,
            "statuses": storm_statuses,
        },
        "double_bookings": double_bookings,
    }
    print(
        f"    conflict_storm: {storm_statuses}  granted {granted_gpus}/{capacity}  "
        f"double_bookings {double_bookings}"
    )
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    return double_bookings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    url = urlsplit(args.url)
    if url.hostname not in LOOPBACK:
        parser.error("--url must be a loopback address (127.0.0.1, localhost or [::1])")
    if args.clients < 1 or args.duration_s <= 0 or args.storm_clients < 2:
        parser.error("--clients ≥ 1, --duration-s > 0 and --storm-clients ≥ 2 are required")

    if args.setup:
        tokens, gpu_type, project, cluster = setup_bench_lab(
            clients=max(args.clients, args.storm_clients), nodes=args.bench_nodes
        )
    elif args.token:
        tokens, gpu_type, project, cluster = args.token, args.gpu_type, args.project, args.cluster
    else:
        parser.error("give --setup or at least one --token")
    target = Target(
        host=url.hostname or "127.0.0.1",
        port=url.port or 80,
        tokens=tuple(tokens),
        gpu_type=gpu_type,
        project=project,
        cluster=cluster,
    )

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"availability", "booking_create", "bookings_list", "refused_booking", "mixed"}
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if {"refused_booking", "mixed"} & set(phases):
        if not args.setup:
            parser.error("the refused_booking and mixed phases need --setup (they fill a window first)")
        target = fill_window(target, nodes=args.bench_nodes)
    meter = CpuMeter(args.server_pid, with_db=args.setup) if os.path.isdir("/proc") else None
    endpoints: dict[str, dict[str, Any]] = {}
    ctx = mp.get_context("fork")
    with ctx.Pool(max(args.clients, args.storm_clients)) as pool:
        for phase in phases:
            endpoints[phase] = run_phase(
                pool,
                target,
                phase=phase,
                clients=args.clients,
                duration_s=args.duration_s,
                base_hour=24,
                meter=meter,
            )
            _print_phase(phase, endpoints[phase])

        storm_start, storm_end, codes = _storm(pool, target, clients=args.storm_clients, per_client=8)
    storm_statuses = {str(c): codes.count(c) for c in sorted(set(codes))}

    double_bookings = _report(
        args, cluster=cluster, endpoints=endpoints, storm=(storm_start, storm_end), statuses=storm_statuses
    )
    return 0 if double_bookings == 0 and "500" not in storm_statuses else 1


if __name__ == "__main__":
    sys.exit(main())
