#!/usr/bin/env bash
# The console's suite on both databases at once, one pytest process each: SQLite, the embedded
# default, and PostgreSQL, the database DATABASE_URL switches to. One after the other they were
# 13 of make test's minutes on a slow machine; both are CPU-bound in one process, and the
# machine has two cores. Each run has a data directory of its own (Celery's file-system broker,
# logs, the secret key) and KV directory; the websocket tests on Redis use a channel prefix of
# their own. SQLite's test database is a file in the data directory (console/settings.py), so
# that directory is on tmpfs: the suite commits thousands of times, and a disk's fsync would
# cost it minutes.
#
# The SQLite run ends 1.5 minutes before PostgreSQL's (325 s against 418 s in the fresh-clone
# run of 2026-12-05): the unit suite (65 s, no server of any kind) runs after it on the core it
# leaves idle, instead of after both. Running more beside the console suite slowed both halves
# down (CHANGELOG.md). With pytest arguments (a chosen part of the console suite) the unit suite
# does not run.
#
#   scripts/test-console.sh POSTGRES_URL [pytest arguments...]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
postgres_url=${1:?usage: scripts/test-console.sh POSTGRES_URL [pytest arguments...]}
shift
sqlite_log=$(mktemp)
unit_log=$(mktemp)
trap 'rm -f "$sqlite_log" "$unit_log"' EXIT

(
  env -u DATABASE_URL PDSERVE_DATA_DIR=/dev/shm/pdserve-test-console-sqlite-data \
    PDSERVE_KV_DIR=/dev/shm/pdserve-test-console-sqlite \
    "$PY" -m pytest tests/console -q -p no:cacheprovider "$@" >"$sqlite_log" 2>&1
  echo $? >"$sqlite_log.status"
  if [ "$#" -eq 0 ]; then
    "$PY" -m pytest tests/unit -q -p no:cacheprovider >"$unit_log" 2>&1
    echo $? >"$unit_log.status"
  else
    echo 0 >"$unit_log.status"
  fi
) &
sqlite_pid=$!
echo "== tests/console on PostgreSQL ($postgres_url); on SQLite beside it, then tests/unit (pid $sqlite_pid)"
DATABASE_URL=$postgres_url PDSERVE_DATA_DIR="$PWD/data/test-console-postgres" \
  PDSERVE_KV_DIR=/dev/shm/pdserve-test-console-postgres \
  "$PY" -m pytest tests/console -q -p no:cacheprovider "$@"
postgres_status=$?
wait "$sqlite_pid"
sqlite_status=$(cat "$sqlite_log.status" 2>/dev/null || echo 1)
unit_status=$(cat "$unit_log.status" 2>/dev/null || echo 1)
rm -f "$sqlite_log.status" "$unit_log.status"
echo "== tests/console on SQLite"
cat "$sqlite_log"
echo "== tests/unit (after SQLite's run)"
cat "$unit_log"
echo "== PostgreSQL exit $postgres_status, SQLite exit $sqlite_status, unit exit $unit_status"
[ "$postgres_status" -eq 0 ] && [ "$sqlite_status" -eq 0 ] && [ "$unit_status" -eq 0 ]
