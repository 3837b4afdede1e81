#!/usr/bin/env bash
# Install what the tests need on a fresh Debian machine (Debian packages + .venv/), then run
# lint, type checks, the import contracts, the docs build and the whole test suite in .venv/. The real control plane
# (../shared/k8s-bin + Debian's etcd) is found by the test harness itself.
# Usage: bash hack/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
# The demo's end-to-end test uses real busybox binaries of four architectures.
bash hack/fetch-debs.sh || echo "demo .debs unavailable: the demo end-to-end tests will be skipped" >&2
PY=.venv/bin/python
# CI is never green without the real control plane: stop at once, with one line, when it is
# not found (tests/conftest.py refuses the same in pytest itself).
if [ "${CI:-}" = "true" ]; then
  "$PY" -c 'import sys; from tests.conftest import ci_refusal; r = ci_refusal(); sys.exit(r and f"hack/test.sh: {r}")'
fi
# the venv's console scripts (podplacement, kubectl) for the tests that run them
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; $PY -m ruff check .
echo "== mypy"; $PY -m mypy
echo "== import contracts (docs/design.md layering)"; .venv/bin/lint-imports
# The docs site: every warning fails (mkdocs.yml: strict, links and anchors validated), so a
# broken internal link fails CI; built into a temporary directory, nothing is kept.
echo "== docs (mkdocs build --strict)"
site=$(mktemp -d)
# (never --quiet: it silences the warnings, and strict mode then counts none)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"
$PY hack/crdref.py --check
$PY hack/dashboard.py --check
echo "== pytest"
# Two workers, one test module each at a time (--dist loadfile: a module's fixtures, e.g. its
# real control plane, stay in one process); most end-to-end time is spent waiting on real
# servers, so two workers halve the wall time on 2 cores. PYTEST_WORKERS=0 runs in-process.
exec $PY -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
