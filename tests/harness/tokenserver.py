"""A small bearer-token issuer for the token-auth registry variant, following Docker registry
token authentication: ``GET realm?service=S&scope=repository:NAME:pull,push`` with optional
Basic credentials answers ``{"token", "access_token", "expires_in", "issued_at"}``; the token is
an RS256 JWT whose header carries ``x5c`` (the signing certificate, base64 DER) chaining to the
root bundle the registry trusts, with claims ``iss``, ``sub``, ``aud``, ``exp``, ``nbf``,
``iat``, ``jti`` and ``access``. Also answers the OAuth2 form ``POST realm`` with
``grant_type=password``. Runs on 127.0.0.1 in a thread and records every request."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import ssl
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives import serialization

from podplacement import certs
from tests.harness.httpserver import QuietHTTPServer

TOKEN_PATH = "/token"
TOKEN_FIELDS = ("token", "access_token", "both")
KNOWN_ACTIONS = ("pull", "push", "delete", "*")


@dataclass(frozen=True)
class TokenRequest:
    """One request the token server saw.

    Attributes:
        method: ``GET`` or ``POST``.
        path: request path (without query).
        params: query (GET) or form (POST) parameters, each a list of values.
        headers: request headers (lower-cased names).
        username: the Basic (or form) user name, None when anonymous.
        status: the HTTP status answered.
        granted: the ``access`` claim issued (empty when refused).
    """

    method: str
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]
    username: str | None
    status: int
    granted: list[dict[str, Any]]


def parse_scope(scope: str) -> dict[str, Any] | None:
    """Parse ``TYPE:NAME:ACTIONS`` (the name may itself contain ``:``, e.g. a port) into an
    access entry ``{"type", "name", "actions": [...]}``; None when malformed."""
    head, sep, actions = scope.rpartition(":")
    if not sep:
        return None
    rtype, sep, name = head.partition(":")
    if not sep or not rtype or not name:
        return None
    return {"type": rtype, "name": name, "actions": [a for a in actions.split(",") if a]}


@dataclass
class TokenServer:
    """A running token issuer.

    Attributes:
        url: base URL (``http://127.0.0.1:PORT`` or https).
        realm: ``url + "/token"``, the registry's ``auth.token.realm``.
        service, issuer: the ``aud`` and ``iss`` claims the registry expects.
        root_cert_pem: the CA certificate to put in the registry's ``rootcertbundle``.
        users: accepted Basic credentials ``{username: password}``.
        expires_in: seconds reported in the answer (and the JWT lifetime unless
            ``claim_lifetime`` is set).
        claim_lifetime: JWT ``exp - iat`` in seconds when not None; a negative value issues
            tokens the registry rejects as expired (distribution allows 60 s of leeway).
        token_field: which answer field carries the JWT: ``token``, ``access_token`` or ``both``.
        anonymous_pull: without credentials, grant ``pull`` only instead of answering 401.
        requests: every request seen, oldest first.
    """

    url: str
    service: str
    issuer: str
    root_cert_pem: bytes
    users: dict[str, str]
    expires_in: int = 300
    claim_lifetime: int | None = None
    token_field: str = "both"
    anonymous_pull: bool = False
    requests: list[TokenRequest] = field(default_factory=list)
    _signer: certs.KeyPair | None = field(default=None, repr=False)
    _server: QuietHTTPServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def realm(self) -> str:
        """The token endpoint URL."""
        return self.url + TOKEN_PATH

    def token_requests(self) -> list[TokenRequest]:
        """A snapshot of the requests to the token endpoint."""
        with self._lock:
            return [r for r in self.requests if r.path == TOKEN_PATH]

    def issue(self, subject: str, access: list[dict[str, Any]]) -> str:
        """Sign a JWT for ``subject`` granting ``access`` (RS256, ``x5c`` header).

        Raises:
            RuntimeError: the server has no signing key (stopped or built by hand).
        """
        if self._signer is None:
            raise RuntimeError("token server has no signing key")
        now = dt.datetime.now(dt.UTC)
        lifetime = self.expires_in if self.claim_lifetime is None else self.claim_lifetime
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "aud": self.service,
            "exp": int((now + dt.timedelta(seconds=lifetime)).timestamp()),
            "nbf": int(now.timestamp()) - 5,
            "iat": int(now.timestamp()),
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        der = self._signer.certificate.public_bytes(serialization.Encoding.DER)
        return jwt.encode(
            claims,
            self._signer.key_pem,
            algorithm="RS256",
            headers={"x5c": [base64.b64encode(der).decode()]},
        )

    def _record(self, entry: TokenRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def stop(self) -> None:
        """Shut the HTTP server down and join its thread. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)


def _grant(requested: list[dict[str, Any]], anonymous: bool) -> list[dict[str, Any]]:
    allowed = ("pull",) if anonymous else KNOWN_ACTIONS
    granted = []
    for entry in requested:
        actions = [a for a in entry["actions"] if a in allowed]
        if actions:
            granted.append({**entry, "actions": actions})
    return granted


class _Handler(BaseHTTPRequestHandler):
    server_version = "podplacement-test-token/1"
    protocol_version = "HTTP/1.1"
    token_server: TokenServer  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    def _send_json(self, status: int, body: dict[str, Any], extra: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _basic_user(self) -> tuple[str | None, str | None]:
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic" or not value:
            return None, None
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return "", ""
        return user, password

    def _answer(self, params: dict[str, list[str]], user: str | None, pw: str | None) -> None:
        ts = self.token_server
        path = urlsplit(self.path).path
        headers = {k.lower(): v for k, v in self.headers.items()}

        def finish(status: int, body: dict[str, Any], granted: list[dict[str, Any]]) -> None:
            extra = {}
            if status == 401:
                extra["WWW-Authenticate"] = 'Basic realm="podplacement-test-token"'
            ts._record(
                TokenRequest(self.command, path, params, headers, user, status, granted)
            )
            self._send_json(status, body, extra)

        if path != TOKEN_PATH:
            finish(404, {"error": "not found"}, [])
            return
        if user is not None and ts.users.get(user) != pw:
            finish(401, {"error": "invalid credentials"}, [])
            return
        if user is None and not ts.anonymous_pull:
            finish(401, {"error": "authentication required"}, [])
            return
        requested = [s for s in (parse_scope(v) for v in _scopes(params)) if s is not None]
        granted = _grant(requested, anonymous=user is None)
        token = ts.issue(user or "", granted)
        body: dict[str, Any] = {
            "expires_in": ts.expires_in,
            "issued_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if ts.token_field in ("token", "both"):
            body["token"] = token
        if ts.token_field in ("access_token", "both"):
            body["access_token"] = token
        finish(200, body, granted)

    def do_GET(self) -> None:
        """Docker token flow: ``GET /token?service=..&scope=..`` (Basic auth optional)."""
        user, pw = self._basic_user()
        self._answer(parse_qs(urlsplit(self.path).query), user, pw)

    def do_POST(self) -> None:
        """OAuth2 flow: form ``grant_type=password&username=..&password=..&scope=..``."""
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode(errors="replace")) if length else {}
        user, pw = self._basic_user()
        if user is None and form.get("grant_type", [""])[0] == "password":
            user = form.get("username", [""])[0]
            pw = form.get("password", [""])[0]
        self._answer(form, user, pw)


def _scopes(params: dict[str, list[str]]) -> list[str]:
    # several scopes may come as repeated parameters or space-separated in one (OAuth2 form)
    return [s for value in params.get("scope", []) for s in value.split(" ") if s]


def _server_ssl_context(serving: certs.KeyPair) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(serving.cert_pem + serving.key_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ctx


def start_token_server(
    *,
    users: dict[str, str],
    service: str,
    issuer: str = "podplacement-test-issuer",
    expires_in: int = 300,
    token_field: str = "both",
    anonymous_pull: bool = False,
    serving: certs.KeyPair | None = None,
) -> TokenServer:
    """Start a token issuer on a free 127.0.0.1 port (HTTPS when ``serving`` is given).

    A fresh RSA CA (the registry's ``rootcertbundle``) signs an RSA leaf certificate whose key
    signs the tokens. See :class:`TokenServer` for the attributes.

    Raises:
        ValueError: ``token_field`` is not ``token``, ``access_token`` or ``both``.
    """
    if token_field not in TOKEN_FIELDS:
        raise ValueError(f"token_field must be one of {TOKEN_FIELDS}, not {token_field!r}")
    root = certs.generate_ca("podplacement-test-token-root", key_type="rsa")
    signer = certs.issue_serving_cert(root, ["token-signer"], key_type="rsa")
    server = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    scheme = "http"
    if serving is not None:
        # handshake lazily in the handler thread, so a silent client cannot block accept()
        server.socket = _server_ssl_context(serving).wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        scheme = "https"
    port = server.server_address[1]
    ts = TokenServer(
        url=f"{scheme}://127.0.0.1:{port}",
        service=service,
        issuer=issuer,
        root_cert_pem=root.cert_pem,
        users=dict(users),
        expires_in=expires_in,
        token_field=token_field,
        anonymous_pull=anonymous_pull,
        _signer=signer,
        _server=server,
    )
    server.RequestHandlerClass = type("_BoundHandler", (_Handler,), {"token_server": ts})
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
        name=f"token-server-{port}",
    )
    ts._thread = thread
    thread.start()
    return ts
