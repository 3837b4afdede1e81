#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what it needs (Debian packages and the
# virtual environment .venv/, see hack/setup.sh), fetch the real busybox-static binaries of
# four architectures, then run `podplacement demo` (registries, API server, webhook,
# controller, sample workloads, result table) from .venv/. The API server is the real control
# plane when its binaries are found (KUBEBUILDER_ASSETS, ../shared/k8s-bin, or the cache an
# earlier run filled), else localkube, and the demo's first line says which. Extra arguments go
# to `podplacement demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
bash hack/fetch-debs.sh
debs=".demo-cache/debs"
exec .venv/bin/podplacement --log-format text demo --debs "$debs" "$@"
