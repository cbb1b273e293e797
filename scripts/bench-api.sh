#!/usr/bin/env bash
# `make bench-api`: gunicorn (production settings, DEBUG off) on a free loopback port, then
# `python -m bench.api --setup` against it, then stop gunicorn.  Writes artifacts/bench_api.json.
# Knobs: BENCH_WORKERS (default: cores), BENCH_THREADS (4), BENCH_CLIENTS (16),
# BENCH_DURATION_S (10), BENCH_OUT, BENCH_ARGS (more bench.api flags, e.g. --phases).
# Uses DATABASE_URL: the bench adds its own cluster "bench".
#
# Why gthread, one process per core, 4 threads: gunicorn's sync workers close the connection
# after every response (no keep-alive), so each request also paid a TCP connect and accept,
# and 2 x cores + 1 processes on a CPU-bound app only contend for the cores.  A process per
# core uses every core (the GIL binds a process to one); a few threads per process let one
# request's wait for PostgreSQL or Redis overlap another's Python; fewer processes also warm
# the per-process caches (tokens, availability) sooner and hold fewer database connections.
# Measured interleaved on 2 shared cores (availability, 8 clients): 5 sync workers 133-366
# req/s at 1.7-2.9 ms server CPU per request, 2 x 4 gthread 553-754 req/s at 1.4-1.7 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
: "${DATABASE_URL:?DATABASE_URL is required}"
workers="${BENCH_WORKERS:-$(nproc)}"
threads="${BENCH_THREADS:-4}"
out="${BENCH_OUT:-artifacts/bench_api.json}"
port="$($BIN/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$(dirname "$out")" .run
log=.run/bench-api-gunicorn.log

# The per-user write throttle stays on (its Redis round trip is part of every create), with a
# limit above what one bench client can send (4 clients at 200 creates/s are 3000/min each,
# the production default); production keeps BERTH_API_WRITE_THROTTLE_RATE's own default.
export BERTH_API_WRITE_THROTTLE_RATE="${BENCH_WRITE_THROTTLE_RATE:-60000/min}"
export DJANGO_ENV=production DJANGO_DEBUG=0 DJANGO_SECURE_SSL_REDIRECT=0 \
  DJANGO_SECRET_KEY="${DJANGO_SECRET_KEY:-bench-only-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}" \
  DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost" LOG_LEVEL="${LOG_LEVEL:-WARNING}"
$BIN/gunicorn portal.wsgi:application --preload --bind "127.0.0.1:$port" --workers "$workers" --threads "$threads" \
  --worker-class "$([ "$threads" -gt 1 ] && echo gthread || echo sync)" --timeout 60 \
  --log-level warning >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$port/api/schema/" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.3
done
# Warm every worker (URL resolver, DRF, middleware load on a process's first request), so the
# first phase's p99 measures requests, not worker start-up.
seq $(( 8 * workers )) | xargs -P "$workers" -I{} curl -s -o /dev/null "http://127.0.0.1:$port/api/v1/me/" || true
echo "gunicorn pid $pid on 127.0.0.1:$port ($workers workers x $threads threads)"
$BIN/python -m bench.api --url "http://127.0.0.1:$port" --setup --server-pid "$pid" \
  --clients "${BENCH_CLIENTS:-16}" --duration-s "${BENCH_DURATION_S:-10}" --out "$out" ${BENCH_ARGS:-}
