#!/usr/bin/env bash
# Install what the tests need on a fresh Debian machine (Debian packages + .venv/), then run
# lint, type checks and the whole test suite in .venv/. The real control plane
# (../shared/k8s-bin + Debian's etcd) is found by the test harness itself.
# Usage: bash hack/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
# The demo's end-to-end test uses real busybox binaries of four architectures.
bash hack/fetch-debs.sh || echo "demo .debs unavailable: the demo end-to-end tests will be skipped" >&2
PY=.venv/bin/python
# the venv's console scripts (podplacement, kubectl) for the tests that run them
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; $PY -m ruff check .
echo "== mypy"; $PY -m mypy
echo "== import contracts (DESIGN.md layering)"; .venv/bin/lint-imports
echo "== pytest"
exec $PY -m pytest -q "$@"
