#!/usr/bin/env bash
# Back up Berth's PostgreSQL database (pg_dump custom format: compressed, restorable table by table).
#   scripts/backup.sh [OUT_FILE]          (default: backups/berth-<UTC time>.dump)
# Reads DATABASE_URL (postgres://user:password@host:port/db).  The dump is written to a temporary
# file, checked with pg_restore --list, then moved into place (mode 600: it holds password hashes
# and API tokens).  A consistent snapshot: pg_dump runs in one repeatable-read transaction, so
# the portal may keep running.  See docs/operations.md.
set -euo pipefail
: "${DATABASE_URL:?DATABASE_URL is required}"
out="${1:-backups/berth-$(date -u +%Y%m%dT%H%M%SZ).dump}"
mkdir -p "$(dirname "$out")"
umask 077
tmp="$(mktemp "${out}.partial.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
pg_dump --format=custom --compress=6 --no-owner --no-privileges --file="$tmp" --dbname="$DATABASE_URL"
pg_restore --list "$tmp" >/dev/null
mv "$tmp" "$out"
trap - EXIT
echo "backup: $out ($(du -h "$out" | cut -f1))"
