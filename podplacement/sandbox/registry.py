"""A real OCI registry on 127.0.0.1: Debian's ``docker-registry`` (CNCF distribution v2.8)
started as a child process with filesystem storage in a directory of the caller's, in four
variants: plain HTTP, TLS with our own CA, htpasswd basic auth (TLS) and bearer-token auth (TLS,
tokens from a caller-supplied issuer, see :class:`TokenIssuerFactory`; the tests' issuer is
``tests/harness/tokenserver.py``). Shared by ``podplacement demo`` and the tests.

Configuration keys follow distribution's configuration reference (``version: 0.1``,
``storage``, ``http``, ``auth.htpasswd``, ``auth.token``); readiness is the API version check
of the OCI distribution-spec (``GET /v2/``: 200, or 401 when authentication is required). The
basic variant needs the ``bcrypt`` package (distribution reads bcrypt htpasswd entries only).
"""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import httpx
import yaml

from podplacement import certs
from podplacement.sandbox.ports import free_port

__all__ = [
    "AUTH_MODES",
    "DEFAULT_PASSWORD",
    "DEFAULT_USERNAME",
    "READY_TIMEOUT_S",
    "REGISTRY_BINARY",
    "Registry",
    "RegistryStartError",
    "TokenIssuer",
    "TokenIssuerFactory",
    "free_port",
    "ssl_context",
    "start_registry",
]

log = logging.getLogger("podplacement.sandbox")

#: The binary of Debian's ``docker-registry`` package.
REGISTRY_BINARY = "/usr/bin/docker-registry"
#: The ``auth`` values :func:`start_registry` accepts.
AUTH_MODES = ("none", "basic", "token")
#: The one account of the ``basic`` / ``token`` variants unless the caller names another.
DEFAULT_USERNAME = "tester"
DEFAULT_PASSWORD = "s3cret-pass"
#: Seconds :func:`start_registry` waits for ``GET /v2/`` to answer.
READY_TIMEOUT_S = 20.0


class RegistryStartError(RuntimeError):
    """The registry binary is missing, or the process exited or did not answer ``GET /v2/`` in
    time; the message holds the tail of its log file."""


class TokenIssuer(Protocol):
    """A running bearer-token issuer for the ``token`` variant (Docker registry token
    authentication: the registry answers 401 with ``WWW-Authenticate: Bearer realm=..,
    service=..,scope=..`` and accepts RS256 JWTs whose ``x5c`` chain ends at
    ``root_cert_pem``).

    Attributes:
        url: base URL, ``"http(s)://127.0.0.1:PORT"``.
        realm: the URL clients fetch tokens from (the registry's ``auth.token.realm``).
        service: the ``aud`` claim the registry expects (its ``auth.token.service``).
        issuer: the ``iss`` claim the registry expects (its ``auth.token.issuer``).
        root_cert_pem: PEM of the CA for the registry's ``auth.token.rootcertbundle``.
    """

    @property
    def url(self) -> str: ...

    @property
    def realm(self) -> str: ...

    @property
    def service(self) -> str: ...

    @property
    def issuer(self) -> str: ...

    @property
    def root_cert_pem(self) -> bytes: ...

    def stop(self) -> None:
        """Stop serving (idempotent)."""


class TokenIssuerFactory(Protocol):
    """Starts a :class:`TokenIssuer` for :func:`start_registry` (``auth="token"``).

    Called with ``users`` (the one account, ``{username: password}``), ``service`` (the
    audience the registry will check, ``"registry-<port>"``) and ``serving`` (the key pair to
    serve HTTPS with, or None for plain HTTP); returns the running issuer, which the
    :class:`Registry` then owns (its ``stop()`` stops the issuer too).
    """

    def __call__(
        self, *, users: dict[str, str], service: str, serving: certs.KeyPair | None
    ) -> TokenIssuer: ...




def ssl_context(ca_pem: bytes | None) -> ssl.SSLContext | bool:
    """An ``httpx`` ``verify=`` value: a client context trusting only ``ca_pem`` (PEM bytes of
    one or more CA certificates), or ``True`` (system trust) when ``ca_pem`` is None.

    Raises:
        ssl.SSLError: ``ca_pem`` holds no parsable certificate.
    """
    if ca_pem is None:
        return True
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    return ctx


@dataclass
class Registry:
    """A running registry (or a view of one).

    Attributes:
        host: the image-reference domain, ``"127.0.0.1:PORT"``.
        url: base URL, ``"http://127.0.0.1:PORT"`` or ``"https://127.0.0.1:PORT"``.
        ca_pem: PEM of the CA that signed the serving cert (None for plain HTTP).
        username, password: credentials for the ``basic``/``token`` variants (None otherwise).
        auth: ``"none"``, ``"basic"`` or ``"token"``.
        token_server: the token issuer for ``auth == "token"`` (None otherwise).
        root: the directory holding config, storage, htpasswd and ``registry.log``.
        owned: whether ``stop()`` stops the process and token server (False for views).
    """

    host: str
    url: str
    ca_pem: bytes | None
    username: str | None
    password: str | None
    auth: str
    token_server: TokenIssuer | None
    root: Path = field(default_factory=Path)
    owned: bool = field(default=True, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        """Where the registry process writes its log (``root / "registry.log"``)."""
        return self.root / "registry.log"

    def verify(self) -> ssl.SSLContext | bool:
        """An ``httpx`` ``verify=`` value trusting this registry's CA (see
        :func:`ssl_context`)."""
        return ssl_context(self.ca_pem)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the registry log, joined by ``\\n``; ``""`` when the log
        cannot be read."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the registry process (SIGTERM, then SIGKILL after 5 s) and its token server.
        Idempotent; a no-op for views that do not own the process (``owned`` False, e.g. the
        tests' fault proxy view)."""
        if not self.owned:
            return
        proc, self._process = self._process, None
        if proc is not None and proc.poll() is None:
            began = time.monotonic()
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("registry %s (pid %d) did not stop within 5 s; killing it",
                            self.host, proc.pid)
                proc.kill()
                proc.wait(timeout=5)
            log.info("stopped registry %s (pid %d, exit code %s, %.1f s)", self.host, proc.pid,
                     proc.returncode, time.monotonic() - began)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.token_server is not None:
            self.token_server.stop()


def _write_htpasswd(path: Path, username: str, password: str) -> None:
    # distribution's htpasswd reader accepts bcrypt only; Go's bcrypt takes the $2y$ and $2b$
    # prefixes alike. Imported here: only the basic variant needs the package.
    import bcrypt

    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"{username}:{hashed}\n")


def start_registry(
    tmp: Path,
    *,
    tls: bool = False,
    auth: str = "none",
    username: str = DEFAULT_USERNAME,
    password: str = DEFAULT_PASSWORD,
    token_issuer: TokenIssuerFactory | None = None,
    token_server_tls: bool | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    quiet: bool = False,
) -> Registry:
    """Start ``docker-registry serve`` on a free 127.0.0.1 port and wait until ``GET /v2/``
    answers (200, or 401 for the auth variants; OCI distribution-spec API version check).

    Args:
        tmp: a directory (created if missing, kept after stop) for ``config.yml``,
            ``storage/``, ``registry.log`` and, per variant, ``tls.crt``/``tls.key``/``ca.crt``,
            ``htpasswd`` or ``token-root.crt``.
        tls: serve HTTPS with a fresh CA and a cert for ``localhost`` / ``127.0.0.1``.
        auth: ``"none"``, ``"basic"`` (htpasswd, bcrypt; needs the ``bcrypt`` package) or
            ``"token"`` (bearer JWT, RS256 with an ``x5c`` chain to ``rootcertbundle``;
            Docker registry token authentication).
        username, password: the one account for ``basic`` / ``token``.
        token_issuer: starts the token issuer; required for ``auth="token"``, unused
            otherwise.
        token_server_tls: serve the token realm over HTTPS (same CA as the registry, or a
            fresh one when the registry is plain HTTP); defaults to ``tls``.
        ready_timeout: seconds to wait for readiness.
        quiet: serve as a registry tuned for throughput (the benchmarks): log errors only, no
            access log, and the in-memory blob descriptor cache (distribution's
            ``storage.cache.blobdescriptor: inmemory``). The tests keep the full logs.

    Returns:
        the running :class:`Registry`; call ``stop()`` when done.

    Raises:
        ValueError: unknown ``auth``, or ``auth="token"`` without ``token_issuer``.
        RegistryStartError: the binary is missing, or the process died or never became ready
            (the process is stopped first).
        ImportError: ``auth="basic"`` without the ``bcrypt`` package.
    """
    _check_start(auth, token_issuer)
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host = f"127.0.0.1:{port}"
    scheme = "https" if tls else "http"
    config = _base_config(tmp, host, quiet)
    ca_pem: bytes | None = None
    serving: certs.KeyPair | None = None
    if tls:
        serving, ca_pem = _configure_tls(tmp, config["http"])
    token_server: TokenIssuer | None = None
    if auth == "basic":
        _write_htpasswd(tmp / "htpasswd", username, password)
        config["auth"] = {"htpasswd": {"realm": "podplacement-test", "path": str(tmp / "htpasswd")}}
    elif auth == "token" and token_issuer is not None:
        use_tls = tls if token_server_tls is None else token_server_tls
        if use_tls and serving is None:
            ca = certs.generate_ca("podplacement-test-token-ca")
            serving = certs.issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
            ca_pem = ca.cert_pem
        token_server = _start_token_server(tmp, config, token_issuer, {username: password},
                                           port, serving if use_tls else None)
    try:
        proc, log_file = _spawn(tmp, config)
    except BaseException:
        if token_server is not None:
            token_server.stop()
        raise
    registry = Registry(host=host, url=f"{scheme}://{host}", ca_pem=ca_pem,
                        username=username if auth != "none" else None,
                        password=password if auth != "none" else None, auth=auth,
                        token_server=token_server, root=tmp, _process=proc, _log=log_file)
    log.info("started registry %s (pid %d, auth %s), log %s", host, proc.pid, auth,
             registry.log_path)
    try:
        _wait_ready(registry, proc, ready_timeout)
    except BaseException:
        registry.stop()
        raise
    return registry


def _check_start(auth: str, token_issuer: TokenIssuerFactory | None) -> None:
    """Refuse a start that cannot work: unknown ``auth`` or ``auth="token"`` without an
    issuer (ValueError), no registry binary (:class:`RegistryStartError`)."""
    if auth not in AUTH_MODES:
        raise ValueError(f"auth must be one of {AUTH_MODES}, not {auth!r}")
    if auth == "token" and token_issuer is None:
        raise ValueError("auth='token' needs a token_issuer")
    if not Path(REGISTRY_BINARY).exists() and shutil.which("docker-registry") is None:
        raise RegistryStartError(f"{REGISTRY_BINARY} is not installed")


def _base_config(tmp: Path, host: str, quiet: bool) -> dict[str, Any]:
    """distribution's configuration without TLS and auth: filesystem storage in
    ``tmp / "storage"``, serving on ``host`` (``"127.0.0.1:PORT"``), logs per ``quiet``."""
    http_config: dict[str, Any] = {"addr": host, "secret": "podplacement-test-secret"}
    return {
        "version": 0.1,
        "log": {"level": "error" if quiet else "info", "formatter": "text",
                "accesslog": {"disabled": quiet}},
        "storage": {
            "filesystem": {"rootdirectory": str(tmp / "storage")},
            **({"cache": {"blobdescriptor": "inmemory"}} if quiet else {}),
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": http_config,
    }


def _configure_tls(tmp: Path, http_config: dict[str, Any]) -> tuple[certs.KeyPair, bytes]:
    """A fresh CA and a serving cert for ``localhost`` / ``127.0.0.1``, written to
    ``tmp`` (``tls.crt``, ``tls.key``, ``ca.crt``) and set in ``http_config["tls"]``;
    returns ``(serving, PEM of the CA)``."""
    ca = certs.generate_ca("podplacement-test-registry-ca")
    serving = certs.issue_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    (tmp / "tls.crt").write_bytes(serving.cert_pem)
    (tmp / "tls.key").write_bytes(serving.key_pem)
    (tmp / "ca.crt").write_bytes(ca.cert_pem)
    http_config["tls"] = {
        "certificate": str(tmp / "tls.crt"),
        "key": str(tmp / "tls.key"),
    }
    return serving, ca.cert_pem


def _start_token_server(tmp: Path, config: dict[str, Any], token_issuer: TokenIssuerFactory,
                        users: dict[str, str], port: int,
                        serving: certs.KeyPair | None) -> TokenIssuer:
    """Start the token issuer for the registry on ``port`` (HTTPS with ``serving``, plain
    HTTP when None), write its root certificate to ``tmp / "token-root.crt"`` and set
    ``config["auth"]["token"]``; returns the running issuer."""
    token_server = token_issuer(users=users, service=f"registry-{port}", serving=serving)
    (tmp / "token-root.crt").write_bytes(token_server.root_cert_pem)
    config["auth"] = {
        "token": {
            "realm": token_server.realm,
            "service": token_server.service,
            "issuer": token_server.issuer,
            "rootcertbundle": str(tmp / "token-root.crt"),
        }
    }
    return token_server


def _spawn(tmp: Path, config: dict[str, Any]) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Write ``config`` to ``tmp / "config.yml"`` and start ``docker-registry serve`` on it,
    output appended to ``tmp / "registry.log"``; returns the process and the open log."""
    config_path = tmp / "config.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_file = (tmp / "registry.log").open("ab")
    try:
        proc = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    except BaseException:
        log_file.close()
        raise
    return proc, log_file


def _wait_ready(registry: Registry, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    expected = 200 if registry.auth == "none" else 401
    last_error = "no attempt"
    with httpx.Client(verify=registry.verify(), timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RegistryStartError(
                    f"docker-registry exited with {proc.returncode}:\n{registry.log_tail()}"
                )
            try:
                resp = client.get(f"{registry.url}/v2/")
            except httpx.TransportError as exc:
                last_error = repr(exc)
            else:
                if resp.status_code == expected:
                    return
                last_error = f"GET /v2/ answered {resp.status_code}"
            time.sleep(0.05)
    raise RegistryStartError(
        f"docker-registry not ready after {timeout} s ({last_error}):\n{registry.log_tail()}"
    )
