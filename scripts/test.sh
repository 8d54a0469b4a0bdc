#!/usr/bin/env bash
# Sets up .venv and runs the test suite. As root on Debian it first installs and
# starts PostgreSQL and Chromium for the distributed-tuning and report tests
# (set SKIP_SERVICES=1 to skip them; those tests then skip, except under CI=true
# where a missing service is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
if [ "${SKIP_SERVICES:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  WORKBENCH_TEST_PG_URL=$(bash scripts/services.sh | tail -n 1)
  export WORKBENCH_TEST_PG_URL
fi
# reports rendered by the browser tests (screenshots included) are kept here as artifacts
export REPORT_ARTIFACT_DIR=${REPORT_ARTIFACT_DIR:-$PWD/runs/ci-artifacts}
# the one-way import ladder (pyproject.toml, docs/architecture.md)
.venv/bin/lint-imports --no-cache
# three workers (pytest-xdist), one test file each at a time, the longest files first (tests/conftest.py): most of
# the suite waits on processes it starts (trials, the CLIs, their imports, watchdog timeouts), so on 2 cores a third
# worker fills the time the other two wait; `-n 0` after it runs the suite in one process
exec .venv/bin/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
