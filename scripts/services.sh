#!/usr/bin/env bash
# Project-local PostgreSQL and Redis on loopback, for `make demo` and `make test`.
#   scripts/services.sh start|stop|status
# Skipped when DATABASE_URL / REDIS_URL are given. Data lives in .run/ (PG_PORT, REDIS_PORT override ports).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="$PWD/.run"
PG_PORT=${PG_PORT:-55433}
REDIS_PORT=${REDIS_PORT:-56379}
LOCAL_DATABASE_URL="postgres://berth:berth@127.0.0.1:$PG_PORT/berth"
LOCAL_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}
PGDIR="$RUN/pg"
# As root the server runs as "postgres", which must reach its directory; a clone under a private
# home (mode 700) is not reachable, so fall back to a per-checkout directory under /var/tmp.
if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$(dirname "$RUN")" 2>/dev/null; then
  PGDIR="/var/tmp/berth-pg-$(printf '%s' "$PWD" | md5sum | cut -c1-8)"
fi
PGDATA="$PGDIR/data"
export PGOPTIONS="-c client_min_messages=warning"

as_pg() {  # PostgreSQL refuses to run as root: use the postgres account when we are root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  if [ -n "${DATABASE_URL:-}" ] && [ "$DATABASE_URL" != "$LOCAL_DATABASE_URL" ]; then
    echo "DATABASE_URL points elsewhere: not starting PostgreSQL"; return
  fi
  [ -x "$PGBIN/initdb" ] || { echo "PostgreSQL server not found (apt-get install postgresql)" >&2; exit 1; }
  mkdir -p "$PGDIR"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDIR"; fi
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres -A trust --no-sync -E UTF8 >"$PGDIR/initdb.log"
  fi
  if as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
    echo "PostgreSQL already running on 127.0.0.1:$PG_PORT"
  else
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDIR/server.log" -w -o \
      "-p $PG_PORT -k $PGDIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start >/dev/null
    echo "PostgreSQL started on 127.0.0.1:$PG_PORT"
  fi
  psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres" -qtA -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'berth') THEN
    CREATE ROLE berth LOGIN PASSWORD 'berth' CREATEDB;
  END IF;
END $$;
SQL
  psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres" -qtAc \
    "SELECT 1 FROM pg_database WHERE datname='berth'" | grep -q 1 ||
    psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres" -qc "CREATE DATABASE berth OWNER berth" >/dev/null
  # template1 gets btree_gist so that test databases have it too.
  for db in berth template1; do
    psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=$db" -qc "CREATE EXTENSION IF NOT EXISTS btree_gist" >/dev/null
  done
}

redis_start() {
  if [ -n "${REDIS_URL:-}" ] && [ "$REDIS_URL" != "$LOCAL_REDIS_URL" ]; then
    echo "REDIS_URL points elsewhere: not starting Redis"; return
  fi
  command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
  mkdir -p "$RUN/redis"
  if redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
    echo "Redis already running on 127.0.0.1:$REDIS_PORT"; return
  fi
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes --pidfile "$RUN/redis/redis.pid" \
    --dir "$RUN/redis" --logfile "$RUN/redis/redis.log" --save '' --appendonly no --protected-mode yes
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  echo "Redis started on 127.0.0.1:$REDIS_PORT"
}

stop_all() {
  if [ -s "$PGDATA/PG_VERSION" ]; then as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1 || true; fi
  if [ -f "$RUN/redis/redis.pid" ]; then kill "$(cat "$RUN/redis/redis.pid")" 2>/dev/null || true; rm -f "$RUN/redis/redis.pid"; fi
  echo "services stopped"
}

case "${1:-start}" in
  start) pg_start; redis_start ;;
  stop) stop_all ;;
  status) as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status || true; redis-cli -p "$REDIS_PORT" ping || true ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
