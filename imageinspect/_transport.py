"""The HTTP transport: one shared aiohttp client behind a small interface.

The product design names httpx, but on this 2-core machine httpx's AsyncClient reached far
fewer cold manifest GETs/s at 50 concurrent requests than aiohttp (see ``bench/inspect.py``
and the issue's >= 800/s rule), so the one implementation here is aiohttp; swapping libraries
means writing another :class:`Transport`.

The transport also enforces the address guard: every host is resolved through a resolver that
refuses link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254)
unless allowed, so a registry name (or a redirect) cannot point the controller at a metadata
service. The check happens on the addresses actually connected to, so DNS rebinding between
check and connect is not possible. It never logs request headers (they carry credentials).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from imageinspect._errors import ConnectionFailed, Timeout, TooLarge, UnsafeAddress

_FORBIDDEN_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


def is_forbidden_address(address: str) -> bool:
    """True for link-local / cloud metadata addresses (IPv4-mapped IPv6 included)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in _FORBIDDEN_NETWORKS)


class _UnsafeAddressOSError(OSError):
    """Raised inside the resolver; aiohttp wraps OSErrors from resolution for us to unwrap."""


class _GuardedResolver(AbstractResolver):
    """Resolve with the thread-pool resolver, then refuse forbidden addresses."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        bad = [r["host"] for r in results if is_forbidden_address(r["host"])]
        if bad:
            raise _UnsafeAddressOSError(f"{host} resolves to link-local/metadata address {bad[0]}")
        return results

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class Response:
    """An HTTP response read in full.

    Attributes:
        status: HTTP status code.
        headers: header names lower-cased; repeated headers joined with ``", "``.
        www_authenticate: each ``WWW-Authenticate`` header value separately.
        body: the body bytes (empty for HEAD).
        url: the URL that was requested.
    """

    status: int
    headers: Mapping[str, str]
    www_authenticate: tuple[str, ...]
    body: bytes
    url: str


class Transport(Protocol):
    """What the inspector needs from an HTTP library."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        max_body: int,
        ssl_context: ssl.SSLContext | bool,
        data: bytes | None = None,
    ) -> Response:
        """Send one request without following redirects; read at most ``max_body`` bytes.

        Raises:
            Timeout, ConnectionFailed, UnsafeAddress, TooLarge.
        """
        ...

    async def aclose(self) -> None:
        """Close pooled connections."""
        ...


class AiohttpTransport:
    """:class:`Transport` on one shared :class:`aiohttp.ClientSession` (created lazily inside
    the running loop), with connection reuse and the address guard.

    Args:
        timeout: seconds for the whole request, and separately for connecting and for each read.
        limit_per_host: pooled connections per host (the inspector's per-registry semaphore
            bounds concurrency; this only caps sockets).
        allow_link_local: disable the address guard (never in production).
    """

    def __init__(
        self, *, timeout: float = 10.0, limit_per_host: int = 16, allow_link_local: bool = False
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=timeout, sock_connect=timeout, sock_read=timeout
        )
        self._limit_per_host = limit_per_host
        self._allow_link_local = allow_link_local
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self._limit_per_host,
                resolver=None if self._allow_link_local else _GuardedResolver(),
                ttl_dns_cache=30,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=True,
                headers={"User-Agent": "podplacement-imageinspect"},
            )
        return self._session

    def _check_literal(self, url: str) -> None:
        host = urlsplit(url).hostname or ""
        if not self._allow_link_local and is_forbidden_address(host):
            raise UnsafeAddress(
                f"refusing to connect to link-local/metadata address {host}",
                registry=urlsplit(url).netloc,
            )

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        max_body: int,
        ssl_context: ssl.SSLContext | bool,
        data: bytes | None = None,
    ) -> Response:
        """See :meth:`Transport.request`."""
        self._check_literal(url)
        netloc = urlsplit(url).netloc
        session = self._get_session()
        kwargs: dict[str, Any] = {"allow_redirects": False, "ssl": ssl_context}
        try:
            async with session.request(
                method, url, headers=dict(headers), data=data, **kwargs
            ) as resp:
                body = b""
                if method != "HEAD":
                    length = resp.content_length
                    if length is not None and length > max_body:
                        raise TooLarge(
                            f"Content-Length {length} bytes",
                            registry=netloc,
                            status=resp.status,
                        )
                    buf = bytearray()
                    async for chunk in resp.content.iter_chunked(65536):
                        buf += chunk
                        if len(buf) > max_body:
                            raise TooLarge(
                                f"more than {max_body} bytes read",
                                registry=netloc,
                                status=resp.status,
                            )
                    body = bytes(buf)
                merged: dict[str, str] = {}
                for name, value in resp.headers.items():
                    key = name.lower()
                    merged[key] = f"{merged[key]}, {value}" if key in merged else value
                return Response(
                    resp.status,
                    merged,
                    tuple(resp.headers.getall("WWW-Authenticate", ())),
                    body,
                    url,
                )
        except TimeoutError as exc:
            raise Timeout(
                f"no answer within the timeout for {method} {url}", registry=netloc
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, _UnsafeAddressOSError):
                raise UnsafeAddress(str(exc.os_error), registry=netloc) from None
            raise ConnectionFailed(
                f"cannot connect: {exc.os_error or exc}", registry=netloc
            ) from exc
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            raise ConnectionFailed(
                f"connection failed during {method} {urlsplit(url).path}: "
                f"{type(exc).__name__}: {exc}",
                registry=netloc,
            ) from exc

    async def aclose(self) -> None:
        """See :meth:`Transport.aclose`."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
            # Let SSL transports finish closing (aiohttp's documented graceful-shutdown pause).
            await asyncio.sleep(0)
        self._session = None
