#!/usr/bin/env bash
# Idempotent setup: Debian packages (the real OCI registry) and the project with test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for pkg in docker-registry; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q || echo "setup: apt-get update reported errors; trying the install anyway" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
python3 -m pip install -q -e '.[test]'
