"""A fault-injecting HTTP reverse proxy on 127.0.0.1 in front of a test registry (or any
upstream URL). Rules answer the next N matching requests with a given status and headers
(e.g. 429 + ``Retry-After``), stall them, drop the connection, redirect them to another
origin, or forward them and replace the body / Content-Type of the upstream answer. Every
request is recorded for counting. The proxy forwards the client's ``Host`` header and sets
``X-Forwarded-Proto`` so that distribution builds upload ``Location`` URLs pointing at the
proxy, not the upstream."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import ssl
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import httpx

from podplacement.certs import KeyPair
from tests.harness.httpserver import QuietHTTPServer
from tests.harness.registry import Registry, ssl_context


def serving_context(serving: KeyPair) -> ssl.SSLContext:
    """A server-side TLS context with ``serving``'s certificate and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(serving.cert_pem + serving.key_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ctx


_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "content-length", "accept-encoding",
    }
)


@dataclass
class FaultRule:
    """One armed fault (see :meth:`FaultProxy.add_rule` for the meaning of the fields).
    ``remaining`` counts down per matching request; <= 0 at creation means unlimited."""

    path_regex: re.Pattern[str]
    method: str | None
    status: int | None
    headers: dict[str, str]
    body: bytes
    delay: float
    remaining: int
    content_type: str | None
    replace_body: bytes | None
    redirect_to: str | None
    close: bool
    unlimited: bool = False

    def matches(self, method: str, path: str) -> bool:
        """Whether a request with ``method`` and ``path`` (no query) triggers this rule."""
        if self.method is not None and self.method.upper() != method:
            return False
        return self.path_regex.search(path) is not None


@dataclass(frozen=True)
class SeenRequest:
    """A request the proxy received.

    Attributes:
        method, path: HTTP method and path without the query.
        target: the full request target (path and query).
        headers: request headers, names lower-cased.
        faulted: whether a rule fired for it.
        status: the status answered to the client (0 when the connection was dropped).
    """

    method: str
    path: str
    target: str
    headers: dict[str, str]
    faulted: bool
    status: int


class FaultProxy:
    """Reverse proxy on 127.0.0.1 with injectable faults.

    Attributes:
        url: ``http://<advertise>:PORT`` (the proxy serves plain HTTP).
        host: ``<advertise>:PORT``, the image-reference domain through the proxy.
        upstream: the upstream base URL.
        requests: ``(method, path)`` of every request seen, oldest first.
        seen: the same requests with headers, fault flag and status.
    """

    def __init__(
        self,
        upstream: Registry | str,
        *,
        ca_pem: bytes | None = None,
        advertise: str = "127.0.0.1",
        bind: str = "127.0.0.1",
        serving: KeyPair | None = None,
    ) -> None:
        """Start the proxy.

        Args:
            upstream: a :class:`Registry` (its URL and CA are used) or a base URL.
            ca_pem: CA to trust for an https upstream given as a URL.
            advertise: host name used in ``url``/``host`` (e.g. ``"localhost"`` to get a
                second origin on the same loopback address); with ``bind``, the bound
                address is advertised.
            bind: the loopback address the socket binds (default 127.0.0.1; another
                127.0.0.0/8 address gives a server that no other test double shares, e.g.
                a canary in a refused network). Anything outside 127.0.0.0/8 is refused.
            serving: a certificate and key: serve HTTPS (``url`` starts with ``https``).
        """
        if not ipaddress.ip_address(bind).is_loopback or ":" in bind:
            raise ValueError(f"the fault proxy binds IPv4 loopback only, not {bind}")
        if bind != "127.0.0.1":
            advertise = bind
        if isinstance(upstream, Registry):
            self.upstream = upstream.url
            ca_pem = upstream.ca_pem
        else:
            self.upstream = upstream.rstrip("/")
        self._client = httpx.Client(
            verify=ssl_context(ca_pem), follow_redirects=False, timeout=30.0
        )
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.requests: list[tuple[str, str]] = []
        self.seen: list[SeenRequest] = []
        handler = type("_BoundProxyHandler", (_ProxyHandler,), {"proxy": self})
        self._server = QuietHTTPServer((bind, 0), handler)
        self._server.daemon_threads = True
        scheme = "http"
        if serving is not None:
            # handshake lazily in the handler thread, so a silent client cannot block accept()
            self._server.socket = serving_context(serving).wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False)
            scheme = "https"
        port = self._server.server_address[1]
        self.host = f"{advertise}:{port}"
        self.url = f"{scheme}://{self.host}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name=f"fault-proxy-{port}",
        )
        self._thread.start()

    def add_rule(
        self,
        *,
        path_regex: str = ".*",
        method: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        delay: float = 0.0,
        times: int = 1,
        content_type: str | None = None,
        replace_body: bytes | None = None,
        redirect_to: str | None = None,
        close: bool = False,
    ) -> None:
        """Arm a fault for the next ``times`` requests whose path matches ``path_regex``
        (``re.search``) and whose method is ``method`` (any when None). ``times <= 0``: every
        matching request until :meth:`clear_rules`. Rules are tried in the order added.

        What a firing rule does, in order:
            1. waits ``delay`` seconds (a stall; cut short by :meth:`stop`);
            2. ``close``: drops the connection without answering;
            3. ``redirect_to``: answers 307 with ``Location: redirect_to + path?query``
               (``status`` overrides 307, ``headers`` are added);
            4. ``status``: answers it with ``headers``, ``body`` and ``content_type``
               without contacting the upstream;
            5. otherwise forwards, then replaces the body with ``replace_body`` and/or the
               Content-Type with ``content_type`` and adds ``headers``.
        """
        rule = FaultRule(
            path_regex=re.compile(path_regex),
            method=method,
            status=status,
            headers=dict(headers or {}),
            body=body,
            delay=delay,
            remaining=times,
            content_type=content_type,
            replace_body=replace_body,
            redirect_to=redirect_to.rstrip("/") if redirect_to else None,
            close=close,
            unlimited=times <= 0,
        )
        with self._lock:
            self._rules.append(rule)

    def as_registry(self, upstream: Registry) -> Registry:
        """A :class:`Registry` view of ``upstream`` reached through this proxy (``host``/``url``
        of the proxy; credentials, token server and ``ca_pem`` of the upstream, the CA being
        still needed for an https token realm). Its ``stop()`` does nothing."""
        return dataclasses.replace(
            upstream, host=self.host, url=self.url, owned=False, _process=None, _log=None
        )

    def clear_rules(self) -> None:
        """Disarm every rule."""
        with self._lock:
            self._rules.clear()

    def count(self, method: str | None = None, path_regex: str = ".*") -> int:
        """How many requests seen match ``method`` (any when None) and ``path_regex``."""
        pattern = re.compile(path_regex)
        with self._lock:
            return sum(
                1
                for m, p in self.requests
                if (method is None or m == method.upper()) and pattern.search(p)
            )

    def reset_requests(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self.requests.clear()
            self.seen.clear()

    def _take_rule(self, method: str, path: str) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path):
                    if not rule.unlimited:
                        rule.remaining -= 1
                        if rule.remaining <= 0:
                            self._rules.remove(rule)
                    return rule
        return None

    def _record(self, entry: SeenRequest) -> None:
        with self._lock:
            self.requests.append((entry.method, entry.path))
            self.seen.append(entry)

    def stop(self) -> None:
        """Stop serving (also ends pending stalls) and close the upstream client. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._client.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "podplacement-fault-proxy/1"
    proxy: FaultProxy  # set on the per-proxy subclass

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # trailers end with an empty line
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(
        self, status: int, headers: list[tuple[str, str]], body: bytes, length: int | None = None
    ) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _handle(self) -> None:
        proxy = self.proxy
        method = self.command
        split = urlsplit(self.path)
        path = split.path
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        rule = proxy._take_rule(method, path)
        faulted = rule is not None

        def record(status: int) -> None:
            proxy._record(SeenRequest(method, path, self.path, headers, faulted, status))

        if rule is not None and rule.delay > 0 and proxy._stopping.wait(rule.delay):
            record(0)
            self.close_connection = True
            return
        if rule is not None and rule.close:
            record(0)
            self.close_connection = True
            return
        if rule is not None and rule.redirect_to is not None:
            status = rule.status or 307
            extra = [("Location", rule.redirect_to + self.path), *rule.headers.items()]
            record(status)
            self._reply(status, extra, rule.body)
            return
        if rule is not None and rule.status is not None:
            extra = list(rule.headers.items())
            if rule.content_type is not None:
                extra.append(("Content-Type", rule.content_type))
            record(rule.status)
            self._reply(rule.status, extra, rule.body)
            return
        forward = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        forward.append(("X-Forwarded-Proto", "http"))
        forward.append(("Accept-Encoding", "identity"))
        try:
            upstream = proxy._client.request(
                method, proxy.upstream + self.path, headers=forward, content=body
            )
        except httpx.HTTPError as exc:
            record(502)
            self._reply(502, [("Content-Type", "text/plain")], f"upstream: {exc}".encode())
            return
        out = [
            (k, v)
            for k, v in upstream.headers.multi_items()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-encoding"
        ]
        payload = upstream.content
        length = None
        if method == "HEAD":
            length = int(upstream.headers.get("Content-Length", "0"))
        if rule is not None:
            if rule.replace_body is not None:
                payload = rule.replace_body
                length = None if method != "HEAD" else len(payload)
            if rule.content_type is not None:
                out = [(k, v) for k, v in out if k.lower() != "content-type"]
                out.append(("Content-Type", rule.content_type))
            replaced = {k.lower() for k in rule.headers}
            out = [(k, v) for k, v in out if k.lower() not in replaced]
            out.extend(rule.headers.items())
        record(upstream.status_code)
        self._reply(upstream.status_code, out, payload, length)

    do_GET = _handle
    do_HEAD = _handle
    do_POST = _handle
    do_PUT = _handle
    do_PATCH = _handle
    do_DELETE = _handle
