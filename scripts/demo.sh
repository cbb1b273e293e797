#!/usr/bin/env bash
# The demo lab: migrate, load the demo cluster, run web + Celery worker + Celery beat on loopback.
#   scripts/demo.sh start   # foreground; Ctrl-C stops what it started
#   scripts/demo.sh stop    # stops a demo started elsewhere (make stop)
#   scripts/demo.sh status
# `make demo` runs `scripts/services.sh start` first (project-local PostgreSQL and Redis).
# Environment: PORT (8000), DATABASE_URL, REDIS_URL, DEMO_ARGS (extra demo_lab flags, e.g. "--reset").
# Logs and pid files: .run/demo/{web,worker,beat,hooks}.{log,pid}.  Mails go to the worker's log (Django's
# console backend); every project's webhook goes to the loopback receiver logged in hooks.log (HOOKS_PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BIN="$ROOT/.venv/bin"
RUN="$ROOT/.run/demo"
PORT=${PORT:-8000}
HOST=127.0.0.1
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-portal.settings}
export PG_PORT=${PG_PORT:-55433}
export REDIS_PORT=${REDIS_PORT:-56379}
export DATABASE_URL=${DATABASE_URL:-postgres://berth:berth@127.0.0.1:$PG_PORT/berth}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:$REDIS_PORT/0}
# Celery refuses nothing as root with JSON-only serialisation; the warning only adds noise to the log.
export C_FORCE_ROOT=${C_FORCE_ROOT:-1}
# The demo cluster is simulated at wall-clock speed, so ETAs, runtimes and lost work mean what they say
# (README "One clock"); BERTH_SIM_SPEEDUP=30 speeds simulated work up and the pages then say so.
export BERTH_SIM_SPEEDUP=${BERTH_SIM_SPEEDUP:-1}
# New work keeps arriving while the demo runs (scheduling.demo_load: jobs, sessions and bookings at the
# demo history's own rate, bounded); BERTH_DEMO_LOAD=0 make demo keeps the cluster to what is there.
export BERTH_DEMO_LOAD=${BERTH_DEMO_LOAD:-1}
# Web and worker share one cache (what-if progress, login lockouts): Redis, as in production.
export BERTH_CACHE_URL=${BERTH_CACHE_URL:-$REDIS_URL}
HOOKS_PORT=${HOOKS_PORT:-8098}
# Links in mails and webhooks point at this demo's own web server (the default is port 8000).
export BERTH_PUBLIC_URL=${BERTH_PUBLIC_URL:-http://$HOST:$PORT}
SERVICES=(web worker beat hooks)

is_running() {  # is_running NAME: the pid file names a live process
  local pidfile="$RUN/$1.pid"
  [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

stop_one() {  # stop_one NAME: TERM, wait up to 15 s (Celery finishes its task), then KILL
  local name=$1 pidfile="$RUN/$1.pid" pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "  $name (pid $pid) did not stop in 15 s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "  stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

stop_all() {
  local name
  # Beat first so that it sends nothing more, web last so that the page answers until the end.
  for name in beat worker hooks web; do stop_one "$name"; done
}

LOG_MAX_BYTES=${DEMO_LOG_MAX_BYTES:-10485760}  # rotate a log above 10 MiB, keep 3 old ones
LOG_KEEP=3

rotate_log() {  # rotate_log NAME: name.log -> name.log.1 -> ... (never truncated in place)
  local log="$RUN/$1.log" i
  [ -f "$log" ] && [ "$(stat -c %s "$log")" -gt "$LOG_MAX_BYTES" ] || return 0
  for i in $(seq $((LOG_KEEP - 1)) -1 1); do [ -f "$log.$i" ] && mv -f "$log.$i" "$log.$((i + 1))"; done
  mv -f "$log" "$log.1"
}

launch() {  # launch NAME CMD...: background, own session (Ctrl-C reaches only this script), log + pid
  local name=$1; shift
  rotate_log "$name"
  # The command is kept so that supervise() can start it again after a crash.
  printf '%q ' "$@" >"$RUN/$name.cmd"
  echo "=== $(date -u +%FT%TZ) starting $name" >>"$RUN/$name.log"
  setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  date +%s >"$RUN/$name.started"
}

declare -A RESTARTS=() NEXT_TRY=()
supervise() {  # supervise NAME: a process that exited is started again, with backoff 2, 4, ... 60 s
  local name=$1 now ran delay
  now=$(date +%s)
  if [ -z "${NEXT_TRY[$name]:-}" ]; then
    ran=$(( now - $(cat "$RUN/$name.started" 2>/dev/null || echo "$now") ))
    # A process that ran a while before it died starts a fresh backoff.
    [ "$ran" -gt 60 ] && RESTARTS[$name]=0
    RESTARTS[$name]=$(( ${RESTARTS[$name]:-0} + 1 ))
    delay=$(( 2 ** RESTARTS[$name] )); [ "$delay" -gt 60 ] && delay=60
    NEXT_TRY[$name]=$(( now + delay ))
    echo "$(date -u +%T) $name exited (restart ${RESTARTS[$name]} in ${delay} s); last lines of .run/demo/$name.log:" >&2
    tail -n 20 "$RUN/$name.log" >&2 || true
    echo "=== $(date -u +%FT%TZ) $name exited; restarting in ${delay} s" >>"$RUN/$name.log"
  fi
  if [ "$now" -ge "${NEXT_TRY[$name]}" ]; then
    unset "NEXT_TRY[$name]"
    eval "launch $name $(cat "$RUN/$name.cmd")"
  fi
}

wait_for_web() {
  local url="http://$HOST:$PORT/login/"
  for _ in $(seq 150); do
    if "$BIN/python" - "$url" <<'PY' 2>/dev/null; then return 0; fi
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:  # noqa: S310 - loopback URL built above
    sys.exit(0 if r.status == 200 else 1)
PY
    is_running web || return 1
    sleep 0.2
  done
  return 1
}

start() {
  [ -x "$BIN/python" ] || { echo "no virtualenv in .venv: run 'make demo' (it creates one)" >&2; exit 1; }
  mkdir -p "$RUN"
  rm -f "$RUN/stopping"
  local name
  for name in "${SERVICES[@]}"; do
    if is_running "$name"; then
      echo "the demo is already running ($name pid $(cat "$RUN/$name.pid")): 'make stop' first" >&2
      exit 1
    fi
  done
  if (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; then
    echo "port $PORT on $HOST is taken: choose another with PORT=8010 make demo" >&2
    exit 1
  fi

  echo "==> migrate"
  # Quiet the per-migration lines; a failing migrate still stops the script (pipefail).
  "$BIN/python" manage.py migrate --noinput | { grep -v '^  Applying' || true; }
  echo "==> collectstatic"
  "$BIN/python" manage.py collectstatic --noinput -v 0
  echo "==> demo lab"
  # The logins are printed once, at the end, beside the URL.
  # The forecasts are fitted by a Celery task queued here and run by the worker started below, so
  # the portal answers at once; the pages say "fitting…" until it is done (DEMO_ARGS may override).
  # shellcheck disable=SC2086  # DEMO_ARGS is a list of flags on purpose
  "$BIN/python" manage.py demo_lab --forecasts queue ${DEMO_ARGS:-} | tee "$RUN/demo_lab.log" | sed '/^Logins/,$d'

  trap 'echo; echo "==> stopping"; stop_all; exit 0' INT TERM
  echo "==> starting web, worker, beat and the webhook receiver (logs in .run/demo/)"
  launch web "$BIN/gunicorn" portal.wsgi:application --preload --bind "$HOST:$PORT" --workers 2 --threads 2 \
    --timeout 60 --access-logfile - --error-logfile -
  launch worker "$BIN/celery" -A portal worker --loglevel INFO --concurrency 1 --hostname "berth-demo@%h"
  launch beat "$BIN/celery" -A portal beat --loglevel INFO \
    --scheduler django_celery_beat.schedulers:DatabaseScheduler
  launch hooks "$BIN/python" manage.py webhook_receiver --port "$HOOKS_PORT" --all-projects

  if ! wait_for_web; then
    echo "the web server did not come up; last lines of .run/demo/web.log:" >&2
    tail -n 20 "$RUN/web.log" >&2 || true
    stop_all
    exit 1
  fi

  cat <<EOF

  Berth demo is running:  http://$HOST:$PORT/
  API:                    http://$HOST:$PORT/api/v1/   (docs: http://$HOST:$PORT/api/docs/)
  Logs:                   .run/demo/web.log  .run/demo/worker.log  .run/demo/beat.log
  Notifications:          mails in .run/demo/worker.log, signed webhooks in .run/demo/hooks.log

EOF
  sed -n '/^Logins/,$p' "$RUN/demo_lab.log"
  echo
  echo "Press Ctrl-C to stop (or run 'make stop' from another terminal)."

  # Stay in the foreground; one that dies is restarted with backoff, the others stay up.
  while true; do
    for name in "${SERVICES[@]}"; do
      if [ -e "$RUN/stopping" ] || [ ! -e "$RUN/$name.pid" ]; then
        # 'make stop' is stopping them: let it finish rather than race it for the same pids.
        for _ in $(seq 300); do [ -e "$RUN/stopping" ] || break; sleep 0.1; done
        echo "stopped from elsewhere (make stop)"; stop_all; exit 0
      fi
      # Logs rotate when a process (re)starts; a running one's log is never cut under it.
      if ! is_running "$name"; then supervise "$name"; fi
    done
    sleep 2
  done
}

status() {
  local name
  for name in "${SERVICES[@]}"; do
    if is_running "$name"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

case "${1:-start}" in
  start) start ;;
  stop) mkdir -p "$RUN"; touch "$RUN/stopping"; stop_all; rm -f "$RUN/stopping" ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
