#!/usr/bin/env bash
# The whole suite: import contract, then pytest (Slurm-marked tests run when the local Slurm starts).
# It includes the fault suite (marker "fault", tests/faults/): it starts its own PostgreSQL and Redis
# from the Debian binaries on free loopback ports (as root, PostgreSQL runs as "postgres"), a
# gunicorn, a Celery worker and beat, and never touches the servers started here.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/lint-imports
if [ -x scripts/slurm.sh ] && command -v slurmctld >/dev/null 2>&1; then
  if scripts/slurm.sh start; then
    export BERTH_SLURM=1
  elif [ -n "${CI:-}" ]; then
    echo "Slurm did not start: CI runs the slurm suite against a real Slurm" >&2; exit 1
  else
    echo "warning: Slurm did not start; slurm-marked tests will be skipped" >&2
  fi
  trap 'scripts/slurm.sh stop >/dev/null 2>&1 || true' EXIT
fi
# Tests get Redis databases of their own (broker, cache, engine state): a demo or another
# checkout on the same server keeps its queues, and tests never consume each other's tasks.
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:${REDIS_PORT:-56379}/0}
export REDIS_URL="${REDIS_URL%/*}/9"
$BIN/python -c "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL']).flushdb()"
mkdir -p artifacts
$BIN/pytest "$@"
