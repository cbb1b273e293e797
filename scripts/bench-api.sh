#!/usr/bin/env bash
# `make bench-api`: gunicorn (production settings, DEBUG off) on a free loopback port, then
# `python -m bench.api --setup` against it, then stop gunicorn.  Writes artifacts/bench_api.json.
# Knobs: BENCH_WORKERS (default 2 x cores + 1), BENCH_THREADS (1), BENCH_CLIENTS (16),
# BENCH_DURATION_S (10), BENCH_OUT.  Uses DATABASE_URL: the bench adds its own cluster "bench".
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
: "${DATABASE_URL:?DATABASE_URL is required}"
workers="${BENCH_WORKERS:-$(( 2 * $(nproc) + 1 ))}"
threads="${BENCH_THREADS:-1}"
out="${BENCH_OUT:-artifacts/bench_api.json}"
port="$($BIN/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$(dirname "$out")" .run
log=.run/bench-api-gunicorn.log

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
