"""A real Kubernetes control plane on 127.0.0.1, the envtest convention, found without setup.

:func:`locate_assets` finds the binaries: ``$KUBEBUILDER_ASSETS`` when set (a directory with
``etcd``, ``kube-apiserver`` and, optionally, ``kube-scheduler`` and ``kube-controller-
manager``, as controller-runtime's envtest expects); otherwise the xz-compressed v1.36.2 builds
of ``../shared/k8s-bin`` (searched upwards from the working directory and from this package),
decompressed once into a cache directory this module owns and checked against the SHA-256 sums
listed in that directory's README (a stamp file records the check, so later runs compare sizes
and modification times only); otherwise that cache alone, as an earlier run left it (an
installed wheel, a clone whose ``../shared`` went away). ``etcd`` comes from ``PATH`` or
``/usr/bin/etcd`` (Debian's ``etcd-server``). :func:`locate_kubelet` finds the kubelet the same
way, for a real node (:mod:`podplacement.sandbox.realnode`).

:func:`start_control_plane` starts etcd, kube-apiserver (Node and RBAC authorization with
NodeRestriction, token auth, service-account tokens, a client certificate towards kubelets,
optional audit log), kube-scheduler (client limits raised) and kube-controller-manager
(``--controllers=*,-node-lifecycle-controller``: fake nodes are never marked unreachable) with
generated certificates and a static ``system:masters`` token. Starting and stopping each
process is logged (logger ``podplacement.sandbox``); :meth:`ControlPlane.stop` takes about a
second (see :data:`SHUTDOWN_ARGS`). :func:`add_nodes` creates fake nodes and makes them Ready
and untainted, as a kubelet would, so the scheduler binds pods to them (no kubelet ever runs
the pods: they stay ``Pending`` once bound).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import lzma
import os
import re
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from podplacement import certs
from podplacement.sandbox.ports import free_port

log = logging.getLogger("podplacement.sandbox")

#: The version of the binaries in ``../shared/k8s-bin`` (its README).
K8S_VERSION = "v1.36.2"
#: The control-plane binaries stored xz-compressed in ``k8s-bin`` (``NAME.xz``).
K8S_BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
#: The node agent stored beside them (``kubelet.xz``), decompressed only for a real node
#: (:func:`locate_kubelet`).
KUBELET = "kubelet"
#: Where Debian's ``etcd-server`` installs etcd.
DEBIAN_ETCD = Path("/usr/bin/etcd")

#: kube-apiserver flags that make SIGTERM end it in about a second. On SIGTERM it stops
#: listening and then waits for its open connections to finish (net/http's Shutdown, bounded
#: by --request-timeout, 60 s). With the default grace period of 0 it never tells the watch
#: handlers to end, so one client still watching (the demo's webhook watching its config and
#: the controller's Lease, any informer of a test) keeps it alive for those 60 s. With a grace
#: period it ends every watch at once (clients see the stream close and re-list elsewhere) and
#: exits when they are gone; measured: 60-70 s with a Lease or custom-resource watch open,
#: 1.1-1.2 s with this flag. --shutdown-delay-duration stays 0 (no load balancer to drain).
SHUTDOWN_ARGS = ("--shutdown-watch-termination-grace-period=2s",
                 "--shutdown-delay-duration=0s")
#: The stamp of a checked cache (``{name: [sha256, size, mtime_ns]}``).
VERIFIED_STAMP = ".verified.json"

_SUM_LINE = re.compile(r"^\s*([0-9a-f]{64})\s+(kube-[a-z-]+|kubelet)\s*$", re.MULTILINE)


class AssetsNotFound(Exception):
    """No usable control-plane binaries; ``str(exc)`` is the one-line reason."""


class ControlPlaneError(RuntimeError):
    """A control-plane process did not start or become ready (message names the log)."""


@dataclass(frozen=True)
class Assets:
    """A directory of the envtest convention.

    Attributes:
        directory: holds ``etcd`` and ``kube-apiserver``; ``kube-scheduler`` and
            ``kube-controller-manager`` when present are started too.
        source: where it came from: ``"KUBEBUILDER_ASSETS"`` or the ``k8s-bin`` directory.
    """

    directory: Path
    source: str

    def binary(self, name: str) -> Path | None:
        """``directory/name`` when it exists and is executable, else None."""
        path = self.directory / name
        return path if path.is_file() and os.access(path, os.X_OK) else None


def _ancestors(start: Path) -> Iterator[Path]:
    start = start.resolve()
    yield start
    yield from start.parents


def find_k8s_bin(starts: Iterable[Path] | None = None) -> Path | None:
    """The first ``shared/k8s-bin`` directory found beside ``starts`` or one of their
    ancestors (default: the working directory and this package), or
    ``$PODPLACEMENT_K8S_BIN`` when set. None when there is none."""
    explicit = os.environ.get("PODPLACEMENT_K8S_BIN")
    if explicit:
        return Path(explicit) if Path(explicit).is_dir() else None
    for start in starts if starts is not None else (Path.cwd(), Path(__file__).parent):
        for base in _ancestors(start):
            candidate = base / "shared" / "k8s-bin"
            if (candidate / "kube-apiserver.xz").is_file():
                return candidate
    return None


def read_sums(k8s_bin: Path, names: Sequence[str] = K8S_BINARIES) -> dict[str, str]:
    """``{binary name: sha256 hex}`` from the sums listed in ``k8s_bin/README.md``.

    Raises:
        AssetsNotFound: the README is missing or lists no sum for a binary of ``names``
            (default :data:`K8S_BINARIES`) that has an ``.xz`` file.
    """
    try:
        text = (k8s_bin / "README.md").read_text()
    except OSError as exc:
        raise AssetsNotFound(f"cannot read the sums in {k8s_bin}/README.md: {exc}") from exc
    sums = {name: digest for digest, name in _SUM_LINE.findall(text)}
    for name in names:
        if (k8s_bin / f"{name}.xz").is_file() and name not in sums:
            raise AssetsNotFound(f"{k8s_bin}/README.md lists no SHA-256 sum for {name}")
    return sums


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """``$PODPLACEMENT_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/podplacement``, plus
    ``k8s-bin-<version>``."""
    base = os.environ.get("PODPLACEMENT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "podplacement")
    return Path(base) / f"k8s-bin-{K8S_VERSION}"


def find_etcd() -> Path | None:
    """``etcd`` on ``PATH``, else Debian's ``/usr/bin/etcd``, else None."""
    found = shutil.which("etcd")
    if found:
        return Path(found)
    return DEBIAN_ETCD if DEBIAN_ETCD.is_file() else None


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _read_stamp(cache: Path) -> dict[str, list[Any]]:
    try:
        data = json.loads((cache / VERIFIED_STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def unpack_k8s_bin(k8s_bin: Path, cache: Path, names: Sequence[str] = K8S_BINARIES) -> Path:
    """Decompress each ``NAME.xz`` of ``k8s_bin`` (``NAME`` in ``names``, default
    :data:`K8S_BINARIES`) into ``cache/NAME`` unless a file there
    already has the listed SHA-256; check every result against the sums. The check is
    recorded in ``cache/.verified.json`` (sum, size, modification time per binary): a later
    call trusts a binary whose listed sum, size and modification time are unchanged without
    reading it again. A lock file makes concurrent callers (the demo and a test run) wait for
    one another.

    Returns: ``cache``.

    Raises:
        AssetsNotFound: a sum is missing, a decompressed binary does not match its sum, or
            the cache directory can't be written.
    """
    sums = read_sums(k8s_bin, names)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock: IO[bytes] = open(cache / ".lock", "wb")  # held until return
    except OSError as exc:
        raise AssetsNotFound(f"cannot write the binaries cache {cache}: {exc}") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = _read_stamp(cache)
        # the stamps of binaries this call does not check stay (the kubelet's, the others')
        checked: dict[str, list[Any]] = {n: k for n, k in stamp.items() if n not in names}
        for name in names:
            src = k8s_bin / f"{name}.xz"
            if not src.is_file():
                continue
            target = cache / name
            if target.is_file():
                key = [sums[name], *_stat_key(target)]
                if stamp.get(name) == key or _sha256(target) == sums[name]:
                    checked[name] = key
                    continue
            log.info("decompressing %s into %s (once; checked against %s/README.md)",
                     src, cache, k8s_bin)
            tmp = cache / f".{name}.partial"
            try:
                with lzma.open(src) as fin, tmp.open("wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
            except (OSError, lzma.LZMAError) as exc:
                tmp.unlink(missing_ok=True)
                raise AssetsNotFound(f"cannot decompress {src}: {exc}") from exc
            got = _sha256(tmp)
            if got != sums[name]:
                tmp.unlink(missing_ok=True)
                raise AssetsNotFound(
                    f"{src} decompresses to sha256 {got}, not the listed {sums[name]}")
            tmp.chmod(0o755)
            tmp.replace(target)
            checked[name] = [sums[name], *_stat_key(target)]
        if checked != stamp:
            with contextlib.suppress(OSError):
                (cache / VERIFIED_STAMP).write_text(json.dumps(checked))
    return cache


#: How to get the binaries, for the messages of :class:`AssetsNotFound`.
HOW_TO_GET = (
    "set KUBEBUILDER_ASSETS to a directory holding etcd and kube-apiserver (+ kube-scheduler, "
    "kube-controller-manager) v1.36, as envtest's setup-envtest installs them, or put the "
    "project's shared/k8s-bin (the xz-compressed builds and their README with the sums) "
    "beside the checkout, with Debian's etcd-server installed")


def _link_etcd(cache: Path, etcd: Path) -> None:
    link = cache / "etcd"
    if not (link.is_symlink() and link.resolve() == etcd.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(etcd)


def locate_assets(env: Mapping[str, str] | None = None,
                  starts: Iterable[Path] | None = None,
                  cache: Path | None = None) -> Assets:
    """Find the control-plane binaries without setup (module docstring for the order):
    ``KUBEBUILDER_ASSETS``, else ``shared/k8s-bin`` beside ``starts`` (decompressed into
    ``cache``, default :func:`default_cache_dir`), else ``cache`` as an earlier run left it.

    Returns: the :class:`Assets`; ``source`` is ``"KUBEBUILDER_ASSETS"``, the ``k8s-bin``
    directory, or ``"cache"``.

    Raises:
        AssetsNotFound: none found; the one-line message says what was looked for and how to
            get the binaries.
    """
    env = os.environ if env is None else env
    explicit = env.get("KUBEBUILDER_ASSETS")
    if explicit:
        assets = Assets(Path(explicit), "KUBEBUILDER_ASSETS")
        missing = [n for n in ("etcd", "kube-apiserver") if assets.binary(n) is None]
        if missing:
            raise AssetsNotFound(
                f"KUBEBUILDER_ASSETS={explicit} has no executable {' or '.join(missing)}")
        return assets
    cache = default_cache_dir() if cache is None else cache
    k8s_bin = find_k8s_bin(starts)
    cached = Assets(cache, "cache")
    if k8s_bin is None and cached.binary("kube-apiserver") is None:
        raise AssetsNotFound(
            "no control plane: KUBEBUILDER_ASSETS is unset, no shared/k8s-bin was found "
            f"beside the checkout and {cache} holds no kube-apiserver; to get one, "
            + HOW_TO_GET)
    etcd = find_etcd()
    if etcd is None:
        raise AssetsNotFound(
            "no etcd on PATH or at /usr/bin/etcd (Debian's etcd-server package)")
    if k8s_bin is None:
        _link_etcd(cache, etcd)
        return cached
    unpack_k8s_bin(k8s_bin, cache)
    _link_etcd(cache, etcd)
    return Assets(cache, str(k8s_bin))


def locate_kubelet(env: Mapping[str, str] | None = None,
                   starts: Iterable[Path] | None = None,
                   cache: Path | None = None) -> Path:
    """Find the kubelet the way :func:`locate_assets` finds the control plane:
    ``$KUBEBUILDER_ASSETS/kubelet`` when that directory holds one, else ``kubelet.xz`` of
    ``shared/k8s-bin`` decompressed into ``cache`` (checked against its README's sum), else
    ``cache/kubelet`` as an earlier run left it.

    Returns: the executable's path.

    Raises:
        AssetsNotFound: none found (one-line reason).
    """
    env = os.environ if env is None else env
    explicit = env.get("KUBEBUILDER_ASSETS")
    if explicit:
        found = Assets(Path(explicit), "KUBEBUILDER_ASSETS").binary(KUBELET)
        if found is not None:
            return found
    cache = default_cache_dir() if cache is None else cache
    k8s_bin = find_k8s_bin(starts)
    if k8s_bin is not None and (k8s_bin / f"{KUBELET}.xz").is_file():
        unpack_k8s_bin(k8s_bin, cache, (KUBELET,))
    found = Assets(cache, "cache").binary(KUBELET)
    if found is None:
        raise AssetsNotFound(
            "no kubelet: KUBEBUILDER_ASSETS holds none, no shared/k8s-bin/kubelet.xz was found "
            f"beside the checkout and {cache} holds no kubelet")
    return found


# --- starting it --------------------------------------------------------------------------




#: Audit policy for request counting: every request at level Metadata (no bodies).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass
class ControlPlane:
    """A running control plane.

    Attributes:
        url: ``https://127.0.0.1:PORT`` of kube-apiserver.
        kubeconfig: admin kubeconfig (static token, group ``system:masters``).
        token: that token; ``ca_file``: the CA that signed the serving certificate.
        workdir: certificates, etcd data, ``control-plane.log``, the audit log.
        processes: ``{"etcd": Popen, "kube-apiserver": ..., ...}`` in start order.
        audit_log: the audit log file when enabled (JSON lines), else None.
    """

    url: str
    kubeconfig: Path
    token: str
    ca_file: Path
    workdir: Path
    assets: Assets
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    audit_log: Path | None = None
    _apiserver_args: list[str] = field(default_factory=list, repr=False)
    _component_args: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    def client(self, timeout: float = 30.0) -> httpx.Client:
        """A new synchronous httpx client with the admin token (close it)."""
        return httpx.Client(base_url=self.url, timeout=timeout,
                            verify=ssl.create_default_context(cafile=str(self.ca_file)),
                            headers={"Authorization": f"Bearer {self.token}",
                                     "Accept": "application/json"})

    def wait_ready(self, limit: float = 60.0) -> None:
        """Poll ``/readyz`` until 200.

        Raises:
            ControlPlaneError: not ready within ``limit`` seconds, or a process exited.
        """
        deadline = time.monotonic() + limit
        with self.client(timeout=2.0) as c:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("/readyz").status_code == 200:
                        return
                dead = [n for n, p in self.processes.items() if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    why = f"{', '.join(dead)} exited" if dead else f"not ready in {limit:.0f} s"
                    raise ControlPlaneError(
                        f"kube-apiserver: {why}; see {self.workdir / 'control-plane.log'}")
                time.sleep(0.25)

    def spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``args`` as the process ``name``, output to ``control-plane.log``; logged
        with its pid. Returns the process (also stored in :attr:`processes`)."""
        proc = subprocess.Popen(list(args), stdout=self._log, stderr=subprocess.STDOUT)
        self.processes[name] = proc
        log.info("started %s (pid %d), log %s", name, proc.pid,
                 self.workdir / "control-plane.log")
        return proc

    def stop_process(self, name: str, timeout: float = 15.0) -> None:
        """SIGTERM the process ``name`` (by its pid), then SIGKILL after ``timeout`` s; the
        stop, its exit code and how long it took are logged."""
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        began = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) did not stop within %.0f s of SIGTERM; killing it",
                        name, proc.pid, timeout)
            proc.kill()
            proc.wait(5)
        log.info("stopped %s (pid %d, exit code %s, %.1f s)", name, proc.pid, proc.returncode,
                 time.monotonic() - began)

    def restart_apiserver(self, down_seconds: float = 0.0, ready_limit: float = 60.0,
                          restart_components: bool = True) -> None:
        """Stop kube-apiserver, keep it down ``down_seconds``, start it again on the same
        port and wait for ``/readyz`` (for outage tests). With ``restart_components``,
        kube-scheduler and kube-controller-manager are then restarted too: their client-go
        reflectors otherwise resume after up to 30 s of backoff (the namespaces of the next
        tests would wait that long for their ``default`` ServiceAccount); what is tested is
        podplacement's recovery, not theirs."""
        self.stop_process("kube-apiserver")
        time.sleep(down_seconds)
        self.spawn("kube-apiserver", self._apiserver_args)
        self.wait_ready(ready_limit)
        if restart_components:
            with self._lock:
                for name in self._component_args:
                    self.stop_process(name)
                self.revive()

    def supervise(self, every: float = 0.5) -> None:
        """Revive exited components every ``every`` seconds in a daemon thread until
        :meth:`stop` (kube-controller-manager may exit well after an API server outage)."""
        def loop() -> None:
            while not self._stopping.wait(every):
                with self._lock:
                    if not self._stopping.is_set():
                        self.revive()

        if self._supervisor is None:
            self._supervisor = threading.Thread(target=loop, name="control-plane supervisor",
                                                daemon=True)
            self._supervisor.start()

    def revive(self) -> list[str]:
        """Start again each kube-scheduler / kube-controller-manager that exited, with its
        original arguments, as the kubelet restarts a static pod (both exit when the API
        server stays away too long: "finished without leader elect"). Returns their names."""
        revived = []
        for name, args in self._component_args.items():
            proc = self.processes.get(name)
            if proc is not None and proc.poll() is not None:
                log.info("%s exited (code %s); starting it again", name, proc.returncode)
                self.spawn(name, args)
                revived.append(name)
        return revived

    def stop(self) -> None:
        """Stop every process, newest first (by pid), and close the log."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(10)
            self._supervisor = None
        for name in reversed(list(self.processes)):
            self.stop_process(name)
        if self._log is not None:
            self._log.close()
            self._log = None


#: The users of the static tokens (all in ``system:masters``): the admin (tests, kubectl) and
#: one per control-plane component, so audit events tell who made each request.
COMPONENT_USERS = ("admin", "system:kube-scheduler", "system:kube-controller-manager")


def _write_pki(workdir: Path) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization

    ca = certs.generate_ca("podplacement-sandbox-ca")
    serving = certs.issue_serving_cert(ca, ["localhost", "kubernetes"], ["127.0.0.1"])
    # the API server's identity towards kubelets (logs, exec), trusted by a real node
    kubelet_client = certs.issue_client_cert(ca, "kube-apiserver-kubelet-client",
                                             ["system:masters"])
    sa_key = certs.new_private_key("rsa")
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    # kept so that a real node's kubelet gets its client certificate from this CA
    (workdir / "ca.key").write_bytes(ca.key_pem)
    (workdir / "kubelet-client.crt").write_bytes(kubelet_client.cert_pem)
    (workdir / "kubelet-client.key").write_bytes(kubelet_client.key_pem)
    (workdir / "serving.crt").write_bytes(serving.cert_pem)
    (workdir / "serving.key").write_bytes(serving.key_pem)
    (workdir / "sa.key").write_bytes(sa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (workdir / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    tokens = {user: os.urandom(16).hex() for user in COMPONENT_USERS}
    (workdir / "tokens.csv").write_text("".join(
        f'{tok},{user},{user}-uid,"system:masters"\n' for user, tok in tokens.items()))
    return tokens


def write_kubeconfig(path: Path, url: str, ca_file: Path, token: str, user: str = "admin") -> Path:
    """A kubeconfig for ``url`` with a bearer ``token``; returns ``path``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {
            "server": url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": user}}],
        "current-context": "sandbox",
    }))
    return path


def start_control_plane(
    assets: Assets,
    workdir: Path,
    *,
    scheduler: bool = True,
    controller_manager: bool = True,
    audit: bool = False,
    apiserver_args: Sequence[str] = (),
    ready_limit: float = 60.0,
) -> ControlPlane:
    """Start etcd, kube-apiserver and (when present and asked) kube-scheduler and
    kube-controller-manager from ``assets`` on 127.0.0.1, all logging to
    ``workdir/control-plane.log``.

    The scheduler runs with ``--kube-api-qps=1000 --kube-api-burst=1000`` (its default 50/100
    caps binding near 50 pods/s); the controller-manager with
    ``--controllers=*,-node-lifecycle-controller`` (creates each namespace's ``default``
    ServiceAccount, runs Deployments and garbage collection, never evicts from fake nodes).

    Raises:
        ControlPlaneError: kube-apiserver is not ready within ``ready_limit`` seconds (every
            process started is stopped first).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    tokens = _write_pki(workdir)
    token = tokens["admin"]
    etcd_client, etcd_peer, api_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{api_port}"
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", url, workdir / "ca.crt", token)
    component_kubeconfig = _write_component_kubeconfigs(workdir, url, tokens)
    log = open(workdir / "control-plane.log", "ab")  # closed by stop()
    plane = ControlPlane(url, kubeconfig, token, workdir / "ca.crt", workdir, assets, _log=log)
    etcd = assets.binary("etcd")
    api = assets.binary("kube-apiserver")
    if etcd is None or api is None:
        log.close()
        raise ControlPlaneError(f"etcd or kube-apiserver missing in {assets.directory}")
    try:  # whatever fails from here, stop() stops what was started, by pid
        plane.spawn("etcd", _etcd_command(etcd, workdir, etcd_client, etcd_peer))
        args = _apiserver_command(api, workdir, api_port, etcd_client)
        if audit:
            args += _audit_args(plane, workdir)
        args += list(apiserver_args)
        plane._apiserver_args = args
        plane.spawn("kube-apiserver", args)
        plane.wait_ready(ready_limit)
        plane._component_args.update(_component_commands(
            assets, workdir, kubeconfig, component_kubeconfig,
            scheduler=scheduler, controller_manager=controller_manager))
        for name, component in plane._component_args.items():
            plane.spawn(name, component)
        plane.supervise()
    except BaseException:
        plane.stop()
        raise
    return plane


def _write_component_kubeconfigs(workdir: Path, url: str,
                                 tokens: Mapping[str, str]) -> dict[str, Path]:
    """One kubeconfig per control-plane component user (``COMPONENT_USERS`` but the admin),
    ``workdir / "<user's last part>.kubeconfig"`` with that user's token; user -> path."""
    return {
        user: write_kubeconfig(workdir / f"{user.split(':')[-1]}.kubeconfig", url,
                               workdir / "ca.crt", tokens[user], user=user)
        for user in COMPONENT_USERS[1:]}


def _etcd_command(etcd: Path, workdir: Path, client_port: int, peer_port: int) -> list[str]:
    """The etcd command line: one member, data in ``workdir / "etcd"``, client and peer
    URLs on 127.0.0.1 (plain HTTP), no fsync, a 4 GiB backend quota."""
    return [
        str(etcd), "--data-dir", str(workdir / "etcd"), "--name", "sandbox",
        "--listen-client-urls", f"http://127.0.0.1:{client_port}",
        "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"sandbox=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30),
    ]


def _apiserver_command(api: Path, workdir: Path, api_port: int, etcd_port: int) -> list[str]:
    """The kube-apiserver command line (without audit and caller flags): HTTPS on
    127.0.0.1:``api_port`` with the PKI of :func:`_write_pki` in ``workdir``, etcd on
    127.0.0.1:``etcd_port``, Node and RBAC authorization, :data:`SHUTDOWN_ARGS`."""
    return [
        str(api), f"--secure-port={api_port}", "--bind-address=127.0.0.1",
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--cert-dir={workdir}", f"--tls-cert-file={workdir / 'serving.crt'}",
        f"--tls-private-key-file={workdir / 'serving.key'}",
        f"--client-ca-file={workdir / 'ca.crt'}",
        f"--token-auth-file={workdir / 'tokens.csv'}",
        # Node + NodeRestriction: what a real node's kubelet may do (podplacement.sandbox.
        # realnode); the kubelet-client pair: the API server's identity for logs and exec
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        f"--kubelet-client-certificate={workdir / 'kubelet-client.crt'}",
        f"--kubelet-client-key={workdir / 'kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={workdir / 'sa.pub'}",
        f"--service-account-signing-key-file={workdir / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/12", "--endpoint-reconciler-type=none",
        "--allow-privileged=true", *SHUTDOWN_ARGS,
    ]


def _audit_args(plane: ControlPlane, workdir: Path) -> list[str]:
    """Write :data:`AUDIT_POLICY` to ``workdir / "audit-policy.yaml"``, set
    ``plane.audit_log`` (``workdir / "audit.log"``) and return the kube-apiserver flags
    writing it (batch mode, flushed every second)."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    plane.audit_log = workdir / "audit.log"
    return [f"--audit-policy-file={policy}", f"--audit-log-path={plane.audit_log}",
            "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s",
            "--audit-log-maxsize=2000"]


def _component_commands(assets: Assets, workdir: Path, kubeconfig: Path,
                    component_kubeconfig: Mapping[str, Path], *, scheduler: bool,
                    controller_manager: bool) -> dict[str, list[str]]:
    """The command lines of kube-scheduler and kube-controller-manager (each when asked
    and present in ``assets``), by name, in start order; each gets a free secure port."""
    components: dict[str, list[str]] = {}
    sched = assets.binary("kube-scheduler") if scheduler else None
    if sched is not None:
        components["kube-scheduler"] = [
            str(sched), f"--kubeconfig={component_kubeconfig['system:kube-scheduler']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--leader-elect=false",
            "--kube-api-qps=1000", "--kube-api-burst=1000",
        ]
    kcm = assets.binary("kube-controller-manager") if controller_manager else None
    if kcm is not None:
        components["kube-controller-manager"] = [
            str(kcm),
            f"--kubeconfig={component_kubeconfig['system:kube-controller-manager']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--leader-elect=false",
            "--controllers=*,-node-lifecycle-controller",
            f"--service-account-private-key-file={workdir / 'sa.key'}",
            f"--root-ca-file={workdir / 'ca.crt'}",
            "--kube-api-qps=1000", "--kube-api-burst=1000",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
        ]
    return components


# --- fake nodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeNode:
    """A node without a kubelet: labels as a kubelet would set them, a Ready status.

    Attributes:
        name: node name (also ``kubernetes.io/hostname``).
        arch / os: ``kubernetes.io/arch`` / ``kubernetes.io/os`` label values.
        cpu / memory / pods: capacity and allocatable (Kubernetes quantities).
        labels: extra labels.
    """

    name: str
    arch: str
    os: str = "linux"
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "500"
    labels: Mapping[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        """The Node object to create."""
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": {
            "kubernetes.io/arch": self.arch, "kubernetes.io/os": self.os,
            "kubernetes.io/hostname": self.name, **self.labels}}}

    def status(self) -> dict[str, Any]:
        """The merge patch of ``/status`` a kubelet would write: Ready, capacity."""
        res = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"status": {"capacity": res, "allocatable": res, "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "fake node (no kubelet)", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}}


#: The ``node.kubernetes.io/windows-build`` label the kubelet sets on a Windows node, here of
#: Windows Server 2022 (the build of the test pusher's windows entries,
#: ``podplacement.sandbox.oci.WINDOWS_OS_VERSION``).
WINDOWS_BUILD_2022 = "10.0.20348"

#: The nodes the tests and the benchmark add: every architecture the product sees, and one
#: windows node (labelled with its build, as a kubelet labels it).
DEFAULT_NODES = (
    FakeNode("node-amd64-a", "amd64"), FakeNode("node-amd64-b", "amd64"),
    FakeNode("node-arm64-a", "arm64"), FakeNode("node-arm64-b", "arm64"),
    FakeNode("node-ppc64le", "ppc64le"), FakeNode("node-s390x", "s390x"),
    FakeNode("node-windows", "amd64", os="windows",
             labels={"node.kubernetes.io/windows-build": WINDOWS_BUILD_2022}),
)


def add_nodes(plane: ControlPlane, nodes: Iterable[FakeNode] = DEFAULT_NODES) -> None:
    """Create ``nodes`` (an existing one is updated), make each Ready and remove the
    ``node.kubernetes.io/not-ready`` taint that the TaintNodesByCondition admission plugin
    adds to a node created without a kubelet.

    Raises:
        httpx.HTTPStatusError: the API server refused a write.
    """
    merge = {"Content-Type": "application/merge-patch+json"}
    with plane.client() as c:
        for node in nodes:
            r = c.post("/api/v1/nodes", json=node.manifest())
            if r.status_code != 409:
                r.raise_for_status()
            path = f"/api/v1/nodes/{node.name}"
            c.patch(f"{path}/status", json=node.status(), headers=merge).raise_for_status()
            c.patch(path, json={"spec": {"taints": None}}, headers=merge).raise_for_status()
