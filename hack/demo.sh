#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what it needs, fetch the real busybox-static
# binaries of four architectures, then run `podplacement demo` (registry, API server, webhook,
# controller, sample workloads, result table). Extra arguments go to `podplacement demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Install only when something is missing (setup.sh re-runs pip, which needs the network).
# (Importing the dependencies too: the checkout's own packages import from the cwd anyway.)
if ! dpkg -s docker-registry >/dev/null 2>&1 || ! python3 -c 'import podplacement.cli
import fastapi, uvicorn, aiohttp, httpx, kubernetes, cryptography, yaml, orjson, bcrypt
import prometheus_client, numpy, msgspec, xxhash, jwt' >/dev/null 2>&1; then
  bash hack/setup.sh
fi
bash hack/fetch-debs.sh
debs=".demo-cache/debs"
exec python3 -m podplacement --log-format text demo --debs "$debs" "$@"
