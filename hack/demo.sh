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
import prometheus_client' >/dev/null 2>&1; then
  bash hack/setup.sh
fi
debs=".demo-cache/debs"
mkdir -p "$debs"
missing=0
for arch in amd64 arm64 ppc64el s390x; do
  ls "$debs"/busybox-static_*_"$arch".deb >/dev/null 2>&1 || missing=1
done
if [ "$missing" = 1 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  for arch in arm64 ppc64el s390x; do
    dpkg --print-foreign-architectures | grep -qx "$arch" || $SUDO dpkg --add-architecture "$arch"
  done
  $SUDO apt-get update -q
  (cd "$debs" && apt-get download busybox-static:amd64 busybox-static:arm64 \
      busybox-static:ppc64el busybox-static:s390x)
fi
exec python3 -m podplacement --log-format text demo --debs "$debs" "$@"
