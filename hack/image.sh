#!/usr/bin/env bash
# Build podplacement's multi-architecture OCI image without a container daemon, and optionally
# push it.
#
#   bash hack/image.sh                                  # -> build/image/ (an OCI image layout)
#   REGISTRY=registry.example.com/podplacement:0.2.0 bash hack/image.sh   # build and push
#   REGISTRY=127.0.0.1:5000/podplacement INSECURE=1 bash hack/image.sh    # plain-HTTP registry
#
# Per architecture, in parallel: mmdebstrap --variant=extract unpacks Debian bookworm's python3
# (3.11), libstdc++6 (numpy's manylinux wheels need it) and the libraries they depend on (no
# maintainer scripts, no emulation); the host's pip installs the project wheel and its
# dependencies as prebuilt manylinux wheels of that architecture into /opt/podplacement/lib
# (it never compiles; an architecture without a wheel for some dependency fails). Byte code is
# compiled on the host (it is the same on every architecture); umoci makes the root filesystem
# one layer and writes the image config. The manifests are joined into one OCI image index
# tagged TAG in the layout (each manifest is also tagged TAG-ARCH). Nothing runs inside the
# image during the build.
#
# Environment:
#   ARCHS     architectures, OCI names (default "amd64 arm64"). ppc64le and s390x are accepted
#             but fail today: msgspec, orjson, numpy and uvloop (and PyYAML on ppc64le,
#             cryptography and httptools on s390x) publish no cp311 wheels for them.
#   OUT       the OCI layout directory (default build/image; replaced when a build succeeds)
#   TAG       the index's tag in the layout (default: the version in pyproject.toml)
#   REGISTRY  push the index to HOST[:PORT]/REPO[:TAG] (TAG defaults to the layout's) with skopeo
#   INSECURE  1: push over plain HTTP or without verifying TLS
#   CACHED_WHEELS  1: install the wheels kept in CACHE without asking the package index
#             (fast and offline; the versions of the last online build); falls back to the index
#   COMPILE   0: no byte code in the image (smaller, but every start compiles in memory)
#   PYTHON    a host Python 3.11 with pip (default .venv/bin/python, else python3)
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   apt mirror URIs (default: mmdebstrap's own default
#                                           mirror, with updates and security for a stable suite)
#   SOURCE_URL  the org.opencontainers.image.source label (default: git remote origin, if any)
#   CACHE     downloaded .debs and wheels, compiled byte code (default ~/.cache/podplacement/image)
# Needs root (mmdebstrap's root mode, root-owned files in the layer) and the Debian packages
# mmdebstrap, umoci and skopeo (bash hack/setup.sh installs them), and network access to the
# Debian mirror and the Python package index.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

die() { echo "image: $*" >&2; exit 1; }
say() { echo "image: $*" >&2; }

ARCHS="${ARCHS:-amd64 arm64}"
OUT="${OUT:-build/image}"
SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-}"
CACHE="${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podplacement/image}"
INSECURE="${INSECURE:-0}"
COMPILE="${COMPILE:-1}"
CACHED_WHEELS="${CACHED_WHEELS:-0}"
LIB=/opt/podplacement/lib
PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap's root mode, root-owned files in the layer); run it with sudo"
for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null 2>&1 \
    || die "$tool is not installed: apt-get install mmdebstrap umoci skopeo (or bash hack/setup.sh)"
done
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null \
  || die "PYTHON=$PYTHON must be Python 3.11 (it compiles byte code for bookworm's python3.11)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "PYTHON=$PYTHON has no pip"

VERSION="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
TAG="${TAG:-$VERSION}"
[[ "$TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "TAG '$TAG' is not a valid image tag"
REVISION="$(git rev-parse HEAD 2>/dev/null || true)"
SOURCE_URL="${SOURCE_URL:-$(git remote get-url origin 2>/dev/null || true)}"

# OCI architecture -> Debian architecture, manylinux wheel architecture
declare -A DEB_ARCH=([amd64]=amd64 [arm64]=arm64 [ppc64le]=ppc64el [s390x]=s390x)
declare -A WHEEL_ARCH=([amd64]=x86_64 [arm64]=aarch64 [ppc64le]=ppc64le [s390x]=s390x)
read -r -a archs <<<"$ARCHS"
[ ${#archs[@]} -gt 0 ] || die "ARCHS is empty"
for arch in "${archs[@]}"; do
  [ -n "${DEB_ARCH[$arch]:-}" ] || die "unknown architecture '$arch' in ARCHS (amd64, arm64, ppc64le, s390x)"
done
[ "$(printf '%s\n' "${archs[@]}" | sort | uniq -d)" = "" ] || die "ARCHS names an architecture twice"

DEST=""
if [ -n "${REGISTRY:-}" ]; then
  [[ "$REGISTRY" == */* ]] || die "REGISTRY must be HOST[:PORT]/REPO[:TAG], not '$REGISTRY'"
  DEST="$REGISTRY"
  last="${REGISTRY##*/}"
  [[ "$last" == *:* || "$last" == *@* ]] || DEST="$REGISTRY:$TAG"
fi

mkdir -p "$(dirname "$OUT")"
OUT="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
WORK="$OUT.work"
rm -rf "$WORK"
mkdir -p "$WORK" "$CACHE/pyc"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

# Run "$1 ARCH" for every architecture at once; fail if any failed (each printed its error).
each_arch() {
  local fn="$1" arch pids=() failed=0
  for arch in "${archs[@]}"; do "$fn" "$arch" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || exit 1
}

# 1. The project wheel, built from a copy of the sources (the working tree stays untouched).
mkdir -p "$WORK/src" "$WORK/wheel"
cp pyproject.toml README.md "$WORK/src/"
for d in */; do
  d="${d%/}"
  [ -f "$d/__init__.py" ] && [ "$d" != tests ] || continue
  tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - "$d" | tar -C "$WORK/src" -xf -
done
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$WORK/wheel" "$WORK/src" >"$WORK/wheel.log" 2>&1 \
  || "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$WORK/wheel" "$WORK/src" >"$WORK/wheel.log" 2>&1 \
  || die "building the podplacement wheel failed: $(grep -E 'rror' "$WORK/wheel.log" | tail -n 1)"
WHEEL="$(ls "$WORK"/wheel/podplacement-*.whl)"

# 2. Per architecture: the root filesystem (Debian's python3, extracted; the .debs are kept in
#    $CACHE/debs between runs) and the wheels (bookworm has glibc 2.36).
rootfs_for() {
  local arch="$1" t0=$SECONDS
  local darch="${DEB_ARCH[$arch]}" warch="${WHEEL_ARCH[$arch]}"
  local rootfs="$WORK/$arch/rootfs" debs="$CACHE/debs/${DEB_ARCH[$arch]}"
  mkdir -p "$debs" "$WORK/$arch"
  local mirrors=()
  if [ -n "$DEBIAN_MIRROR" ]; then
    mirrors=("deb $DEBIAN_MIRROR $SUITE main" "deb $DEBIAN_MIRROR $SUITE-updates main")
    [ -z "$DEBIAN_SECURITY_MIRROR" ] || mirrors+=("deb $DEBIAN_SECURITY_MIRROR $SUITE-security main")
  fi
  mmdebstrap --variant=extract --architectures="$darch" --include=python3,libstdc++6,libgcc-s1 \
    --format=directory \
    --setup-hook="mkdir -p \"\$1/var/cache/apt/archives\" && find '$debs' -maxdepth 1 -name '*.deb' -exec cp -t \"\$1/var/cache/apt/archives\" {} +" \
    --extract-hook="find \"\$1/var/cache/apt/archives\" -maxdepth 1 -name '*.deb' -exec cp -u -t '$debs' {} +" \
    "$SUITE" "$rootfs" "${mirrors[@]}" \
    >"$WORK/$arch/mmdebstrap.log" 2>&1 \
    || die "$arch: mmdebstrap failed: $(grep -E '^E:' "$WORK/$arch/mmdebstrap.log" | head -n 1)"
  [ -x "$rootfs/usr/bin/python3.11" ] || die "$arch: the root filesystem has no /usr/bin/python3.11"
  local t1=$SECONDS platforms=(--platform "manylinux2014_$warch") v
  for v in 17 24 26 27 28 31 34 35 36; do platforms+=(--platform "manylinux_2_${v}_$warch"); done
  local pip_target=(--only-binary=:all: "${platforms[@]}"
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none)
  local wheels="$CACHE/wheels/$darch"
  mkdir -p "$wheels"
  install_wheels() {
    rm -rf "$rootfs$LIB"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile \
      --no-warn-script-location --no-index --find-links "$wheels" --target "$rootfs$LIB" \
      "${pip_target[@]}" --report "$WORK/$arch/pip-report.json" "$WHEEL" >>"$WORK/$arch/pip.log" 2>&1
  }
  if [ "$CACHED_WHEELS" = 1 ] && install_wheels; then
    :
  else
    : >"$WORK/$arch/pip.log"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --dest "$wheels" \
      "${pip_target[@]}" "$WHEEL" >>"$WORK/$arch/pip.log" 2>&1 \
      || die "$arch: no complete set of cp311 $warch wheels: $(grep -E '^ERROR' "$WORK/$arch/pip.log" | head -n 1)"
    rm -f "$wheels"/podplacement-*.whl
    install_wheels || die "$arch: installing the wheels failed: $(grep -E '^ERROR' "$WORK/$arch/pip.log" | head -n 1)"
  fi
  say "$arch: root filesystem in $((t1 - t0)) s, wheels in $((SECONDS - t1)) s"
}
each_arch rootfs_for

# Every architecture must carry the same versions.
"$PYTHON" - "$WORK" "${archs[@]}" <<'EOF' || exit 1
import json, sys
work, archs = sys.argv[1], sys.argv[2:]
sets = {}
for arch in archs:
    report = json.load(open(f"{work}/{arch}/pip-report.json"))
    sets[arch] = {(i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in report["install"]}
first = archs[0]
for arch in archs[1:]:
    diff = sorted(sets[arch] ^ sets[first])
    if diff:
        sys.exit(f"image: {first} and {arch} resolved different versions: "
                 + ", ".join(f"{n} {v}" for n, v in diff))
EOF

# 3. Trim and finish each root filesystem: no docs, caches or device nodes (the runtime
#    provides /dev, /etc/hosts, /etc/resolv.conf); a non-root user 65532; a CA bundle at
#    OpenSSL's default paths (certifi's Mozilla bundle); the entry point.
for arch in "${archs[@]}"; do
  rootfs="$WORK/$arch/rootfs"
  rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian,bug,doc-base,menu} \
    "$rootfs"/usr/lib/*-linux-gnu/gconv "$rootfs"/var/cache/apt "$rootfs"/var/lib/apt/lists \
    "$rootfs"/var/log/* "$rootfs"/dev/* "$rootfs"/etc/{hostname,resolv.conf,fstab} \
    "$rootfs$LIB/bin"
  find "$rootfs" -depth -name __pycache__ -type d -exec rm -rf {} +
  printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$rootfs/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
  install -d -m 0700 "$rootfs/root"
  install -d -m 0755 -o 65532 -g 65532 "$rootfs/home/nonroot"
  chmod 1777 "$rootfs/tmp"
  install -d "$rootfs/etc/ssl/certs" "$rootfs/usr/lib/ssl" "$rootfs/usr/local/bin"
  install -m 0644 "$rootfs$LIB/certifi/cacert.pem" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  ln -sfn /etc/ssl/certs "$rootfs/usr/lib/ssl/certs"
  ln -sfn /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/lib/ssl/cert.pem"
  cat >"$rootfs/usr/local/bin/podplacement" <<EOF
#!/usr/bin/python3
import sys
if "$LIB" not in sys.path:
    sys.path.insert(0, "$LIB")
from podplacement.cli import main
sys.exit(main())
EOF
  chmod 0755 "$rootfs/usr/local/bin/podplacement"
done

# 4. Byte code, compiled on the host once for all architectures (unchecked-hash .pyc: valid on
#    a read-only root filesystem and never rewritten), cached in $CACHE/pyc by file name and
#    source. Test suites and Python-2-era examples are left out.
if [ "$COMPILE" = 1 ]; then
  t0=$SECONDS
  roots=()
  for arch in "${archs[@]}"; do roots+=("$WORK/$arch/rootfs"); done
  "$PYTHON" - "$CACHE/pyc" "$LIB" "${roots[@]}" <<'EOF' || die "compiling byte code failed"
import hashlib, importlib.util, os, py_compile, shutil, sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

cache, lib, roots = Path(sys.argv[1]), sys.argv[2], [Path(r) for r in sys.argv[3:]]
SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__"}

def compile_one(job: tuple[str, str, str]) -> bool:
    src, dfile, cached = job
    tmp = f"{cached}.{os.getpid()}.tmp"
    try:
        py_compile.compile(src, cfile=tmp, dfile=dfile, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    except (py_compile.PyCompileError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    os.replace(tmp, cached)
    return True

wanted: list[tuple[Path, Path]] = []  # (cached pyc, pyc in a root filesystem)
jobs: dict[str, tuple[str, str, str]] = {}
for root in roots:
    for top in (root / "usr/lib/python3.11", root / lib.lstrip("/")):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in SKIP]
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                src = os.path.join(dirpath, name)
                dfile = "/" + os.path.relpath(src, root)
                data = Path(src).read_bytes()
                key = hashlib.sha256(dfile.encode() + b"\0" + data).hexdigest()
                cached = cache / key[:2] / f"{key}.pyc"
                wanted.append((cached, Path(importlib.util.cache_from_source(src))))
                if not cached.exists() and key not in jobs:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    jobs[key] = (src, dfile, str(cached))
with ProcessPoolExecutor() as pool:
    list(pool.map(compile_one, jobs.values(), chunksize=64))
for cached, target in wanted:
    if cached.exists():
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(cached, target)
print(f"image: byte code: {len(wanted)} files, {len(jobs)} compiled now", file=sys.stderr)
EOF
  say "byte code in $((SECONDS - t0)) s"
fi

# 5. Per architecture: one layer plus the image config, in a layout of its own.
layer_for() {
  local arch="$1" t0=$SECONDS
  local rootfs="$WORK/$arch/rootfs" ref="$WORK/$arch/oci:$TAG-$arch"
  local labels=(--config.label "org.opencontainers.image.title=podplacement"
    --config.label "org.opencontainers.image.description=Architecture- and NUMA-aware pod placement for Kubernetes"
    --config.label "org.opencontainers.image.licenses=Apache-2.0"
    --config.label "org.opencontainers.image.version=$VERSION"
    --config.label "org.opencontainers.image.base.name=debian:$SUITE")
  [ -z "$REVISION" ] || labels+=(--config.label "org.opencontainers.image.revision=$REVISION")
  [ -z "$SOURCE_URL" ] || labels+=(--config.label "org.opencontainers.image.source=$SOURCE_URL")
  local size
  size="$(du -sm "$rootfs" | cut -f1)"
  {
    umoci init --layout "$WORK/$arch/oci" &&
    umoci new --image "$ref" &&
    umoci insert --image "$ref" \
      --history.created_by "hack/image.sh: Debian $SUITE python3 ($arch) + wheels" "$rootfs" / &&
    umoci config --image "$ref" --no-history --architecture "$arch" --os linux \
      --config.user 65532:65532 --config.workingdir / \
      --config.env "PATH=$PATH_ENV" --config.env "PYTHONPATH=$LIB" \
      --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
      --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
      --config.entrypoint podplacement --config.cmd --help \
      --config.exposedports 9443/tcp --config.exposedports 8080/tcp "${labels[@]}"
  } >"$WORK/$arch/umoci.log" 2>&1 || die "$arch: umoci failed: $(tail -n 1 "$WORK/$arch/umoci.log")"
  rm -rf "$rootfs"
  say "$arch: layer in $((SECONDS - t0)) s (root filesystem $size MiB)"
}
each_arch layer_for

# 6. One layout: the blobs of every architecture, the image index (one manifest per
#    architecture with its platform) tagged $TAG, each manifest tagged $TAG-ARCH.
LAYOUT="$WORK/oci"
"$PYTHON" - "$LAYOUT" "$TAG" "$WORK" "${archs[@]}" <<'EOF'
import hashlib, json, os, sys
from pathlib import Path

layout, tag, work, archs = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4:]
REF = "org.opencontainers.image.ref.name"
INDEX = "application/vnd.oci.image.index.v1+json"
blobs = layout / "blobs" / "sha256"
blobs.mkdir(parents=True)
(layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
tagged, entries = [], []
for arch in archs:
    src = work / arch / "oci"
    for blob in (src / "blobs" / "sha256").iterdir():
        if not (blobs / blob.name).exists():
            os.link(blob, blobs / blob.name)
    (desc,) = [d for d in json.loads((src / "index.json").read_text())["manifests"]
               if d.get("annotations", {}).get(REF) == f"{tag}-{arch}"]
    manifest = json.loads((blobs / desc["digest"].split(":")[1]).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    platform = {"architecture": config["architecture"], "os": config["os"]}
    if arch == "arm64":
        platform["variant"] = "v8"
    plain = {k: desc[k] for k in ("mediaType", "digest", "size")}
    entries.append({**plain, "platform": platform})
    tagged.append({**plain, "platform": platform, "annotations": {REF: f"{tag}-{arch}"}})
index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries},
                   indent=2).encode()
digest = hashlib.sha256(index).hexdigest()
(blobs / digest).write_bytes(index)
top = {"schemaVersion": 2, "mediaType": INDEX,
       "manifests": [{"mediaType": INDEX, "digest": f"sha256:{digest}", "size": len(index),
                      "annotations": {REF: tag}}, *tagged]}
(layout / "index.json").write_text(json.dumps(top, indent=2) + "\n")
EOF
skopeo inspect --raw "oci:$LAYOUT:$TAG" >/dev/null 2>"$WORK/skopeo.log" \
  || die "the OCI layout is not readable by skopeo: $(tail -n 1 "$WORK/skopeo.log")"
for arch in "${archs[@]}"; do
  umoci stat --image "$LAYOUT:$TAG-$arch" >/dev/null 2>"$WORK/stat.log" \
    || die "$arch: umoci stat failed: $(tail -n 1 "$WORK/stat.log")"
done
rm -rf "$OUT"
mv "$LAYOUT" "$OUT"
say "built oci:$OUT:$TAG (${archs[*]}) in $((SECONDS - start)) s, $(du -sm "$OUT" | cut -f1) MiB"

# 7. Push the index and every manifest, digests unchanged.
if [ -n "$DEST" ]; then
  tls=()
  [ "$INSECURE" = 1 ] && tls=(--dest-tls-verify=false)
  skopeo copy --quiet --all --preserve-digests "${tls[@]}" "oci:$OUT:$TAG" "docker://$DEST" \
    >"$WORK/push.log" 2>&1 || die "pushing to $DEST failed: $(tail -n 1 "$WORK/push.log")"
  say "pushed docker://$DEST"
fi
