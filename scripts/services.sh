#!/usr/bin/env bash
# Installs and starts what the full test suite needs beyond Python packages:
# a PostgreSQL server (the distributed-tuning test shares one Optuna study
# between two workers through it) and Debian's Chromium (the report is opened
# headless). Needs root and Debian's apt; prints the PostgreSQL URL to export.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
read -r ver name _ < <(pg_lsclusters -h | head -n 1)
pg_ctlcluster "$ver" "$name" start 2>/dev/null || true
for _ in $(seq 1 30); do
  su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
  sleep 1
done
su postgres -c "psql -qc \"DO \\\$\\\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='workbench') THEN CREATE ROLE workbench LOGIN PASSWORD 'workbench' CREATEDB; END IF; END \\\$\\\$;\"" >/dev/null
su postgres -c "psql -qAtc \"SELECT 1 FROM pg_database WHERE datname='workbench_test'\"" | grep -q 1 \
  || su postgres -c "createdb -O workbench workbench_test"
echo "postgresql://workbench:workbench@127.0.0.1:5432/workbench_test"
