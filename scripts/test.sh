#!/usr/bin/env bash
# The whole suite: import contract, then pytest (Slurm-marked tests run when the local Slurm starts).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/lint-imports
if [ -x scripts/slurm.sh ] && command -v slurmctld >/dev/null 2>&1; then
  scripts/slurm.sh start && export BERTH_SLURM=1 || echo "warning: Slurm did not start; slurm tests will fail" >&2
  trap 'scripts/slurm.sh stop >/dev/null 2>&1 || true' EXIT
fi
mkdir -p artifacts
$BIN/pytest "$@"
