#!/usr/bin/env bash
# Restore a scripts/backup.sh dump into a fresh database.
#   scripts/restore.sh DUMP_FILE TARGET_DATABASE_URL
# The target database is created if it does not exist; an existing database must be empty
# (no tables in the public schema): this script never overwrites data.  The restore runs in one
# transaction and stops at the first error, so a failed restore leaves the target empty.
# Afterwards point DATABASE_URL at the target and run `manage.py migrate` (a no-op for a dump
# of the same release).  See docs/operations.md.
set -euo pipefail
dump="${1:?usage: scripts/restore.sh DUMP_FILE TARGET_DATABASE_URL}"
target="${2:?usage: scripts/restore.sh DUMP_FILE TARGET_DATABASE_URL}"
[ -r "$dump" ] || { echo "restore: cannot read $dump" >&2; exit 2; }
pg_restore --list "$dump" >/dev/null

base="${target%%\?*}"            # postgres://user:pw@host:port/db
query="${target#"$base"}"        # ?sslmode=... (kept for the admin connection)
dbname="${base##*/}"
admin="${base%/*}/postgres${query}"
[ -n "$dbname" ] && [ "$dbname" != "$base" ] || { echo "restore: no database name in the URL" >&2; exit 2; }

exists="$(psql "$admin" -X -At -v ON_ERROR_STOP=1 -v db="$dbname" \
  <<< "SELECT 1 FROM pg_database WHERE datname = :'db'")"
if [ "$exists" = 1 ]; then
  tables="$(psql "$target" -X -At -v ON_ERROR_STOP=1 \
    -c "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")"
  if [ "$tables" != 0 ]; then
    echo "restore: database $dbname already has $tables tables; restore into a fresh database" >&2
    exit 3
  fi
else
  psql "$admin" -X -q -v ON_ERROR_STOP=1 -v db="$dbname" <<< 'CREATE DATABASE :"db"'
fi
# Skip COMMENT ON EXTENSION: only the extension's owner (often a superuser) may set it, and it
# carries no data.
list="$(mktemp)"
trap 'rm -f "$list"' EXIT
pg_restore --list "$dump" | grep -v ' COMMENT - EXTENSION ' > "$list"
pg_restore --no-owner --no-privileges --exit-on-error --single-transaction --use-list="$list" \
  --dbname="$target" "$dump"
echo "restore: $dump -> database $dbname"
