#!/usr/bin/env bash
# Download Debian's busybox-static for amd64, arm64, ppc64el and s390x into .demo-cache/debs
# (real binaries of each architecture for the demo images), and what the emulated arm64 node
# of podplacement.sandbox.realnode runs: qemu-user-static (amd64), containerd, libc6 and
# libseccomp2 (arm64). Downloaded only (apt-get download), never installed: the sandbox
# extracts them with dpkg-deb -x into its cache (installing qemu-user-static with
# binfmt-support would register qemu in the host's binfmt_misc and break the amd64 node's
# exec format errors). Idempotent; needs root or sudo the first time (dpkg
# --add-architecture, apt-get update).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=".demo-cache/debs"
mkdir -p "$debs"
missing=0
for arch in amd64 arm64 ppc64el s390x; do
  ls "$debs"/busybox-static_*_"$arch".deb >/dev/null 2>&1 || missing=1
done
for pkg in qemu-user-static_*_amd64 containerd_*_arm64 libc6_*_arm64 libseccomp2_*_arm64; do
  ls "$debs"/$pkg.deb >/dev/null 2>&1 || missing=1
done
[ "$missing" = 0 ] && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
for arch in arm64 ppc64el s390x; do
  dpkg --print-foreign-architectures | grep -qx "$arch" || $SUDO dpkg --add-architecture "$arch"
done
$SUDO apt-get update -q >/dev/null || echo "fetch-debs: apt-get update reported errors; trying the download anyway" >&2
(cd "$debs" && apt-get download -q busybox-static:amd64 busybox-static:arm64 \
    busybox-static:ppc64el busybox-static:s390x qemu-user-static:amd64 containerd:arm64 \
    libc6:arm64 libseccomp2:arm64 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
