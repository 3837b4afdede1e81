#!/usr/bin/env bash
# Install what the tests need on a fresh Debian machine, then run lint, type checks and the
# whole test suite. Usage: bash hack/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
# The demo's end-to-end test uses real busybox binaries of four architectures.
bash hack/fetch-debs.sh || echo "demo .debs unavailable: the demo end-to-end tests will be skipped" >&2
echo "== ruff"; python -m ruff check .
echo "== mypy"; python -m mypy
echo "== pytest"
exec python -m pytest -q "$@"
