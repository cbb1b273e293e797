#!/usr/bin/env bash
# The whole suite: import contract, then pytest (Slurm-marked tests run when the local Slurm starts).
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
mkdir -p artifacts
$BIN/pytest "$@"
