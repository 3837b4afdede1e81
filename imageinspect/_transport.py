"""The HTTP transport: one shared aiohttp client behind a small interface.

The product design names httpx, but httpx's AsyncClient (HTTP/1.1) spends 8 to 10 times
aiohttp's CPU per request on the inspection's requests at the inspector's concurrency, against
a real TLS registry (``bench/httpclients.py``, docs/benchmarks.md "HTTP clients"), so the
one implementation here is aiohttp; swapping libraries means writing another
:class:`Transport`.

The transport also enforces the address guard: every host is resolved through a resolver that
refuses the addresses of the refused networks (by default :data:`DEFAULT_REFUSED_NETWORKS`:
link-local and the clouds' metadata addresses, and IPv6 forms embedding a refused IPv4
address: see :func:`is_forbidden_address`) unless allowed, so a registry name, a token realm
or a redirect cannot point the controller at a metadata service. The check happens on the
addresses actually connected to, so DNS rebinding between check and connect is not possible.
Its errors are in our own words: no text of the remote side (a body, a status line, an
address a name resolved to) is in them, only in debug logs. It never logs request headers
(they carry credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from podplacement.imageinspect._errors import ConnectionFailed, Timeout, TooLarge, UnsafeAddress

log = logging.getLogger("podplacement.imageinspect")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The networks refused by default (``spec.imageInspection.refusedNetworks``' default), each
#: with its source:
#:
#: * ``169.254.0.0/16``: IPv4 link-local (RFC 3927); the metadata service of AWS, GCP, Azure,
#:   Oracle, DigitalOcean, OpenStack is 169.254.169.254, AWS ECS task metadata 169.254.170.2.
#: * ``fe80::/10``: IPv6 link-local (RFC 4291 §2.5.6).
#: * ``fd00:ec2::254/128``: AWS instance metadata over IPv6 on Nitro instances, and
#:   ``fd00:ec2::253/128``: the Amazon DNS server (Route 53 Resolver) over IPv6 (AWS
#:   whitepaper "IPv6 on AWS", "Supporting Amazon VPC services"); ``fd00:ec2::23/128`` as
#:   well, named by our security review as an AWS service address (not in that paper).
#: * ``100.100.100.200/32``: Alibaba Cloud ECS instance metadata.
#: * ``168.63.129.16/32``: Azure's WireServer (host DNS, VM agent, health probes).
#:
#: Loopback is not in it (registries on the node itself are a documented setup, and the
#: tests' registries listen on 127.0.0.1); add ``127.0.0.0/8`` and ``::1/128`` where no
#: registry runs there.
DEFAULT_REFUSED_NETWORKS: tuple[str, ...] = (
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "fd00:ec2::253/128",
    "fd00:ec2::23/128",
    "100.100.100.200/32",
    "168.63.129.16/32",
)
#: At most this many refused networks (the CRD's ``maxItems``).
MAX_REFUSED_NETWORKS = 64


def parse_networks(items: Sequence[str]) -> tuple[IPNetwork, ...]:
    """Parse CIDR strings (``10.0.0.0/8``, ``fd00::/8``; a bare address is a /32 or /128;
    host bits set are ignored) into networks, in order, duplicates dropped.

    Raises:
        ValueError: an item is not an IP network (the message names the item's index), or
            there are more than :data:`MAX_REFUSED_NETWORKS`.
    """
    if len(items) > MAX_REFUSED_NETWORKS:
        raise ValueError(f"at most {MAX_REFUSED_NETWORKS} networks, got {len(items)}")
    out: list[IPNetwork] = []
    for i, item in enumerate(items):
        try:
            net = ipaddress.ip_network(str(item).strip(), strict=False)
        except ValueError:
            raise ValueError(f"item {i} is not an IP network in CIDR notation") from None
        if net not in out:
            out.append(net)
    return tuple(out)


DEFAULT_NETWORKS: tuple[IPNetwork, ...] = parse_networks(DEFAULT_REFUSED_NETWORKS)
#: RFC 6052 §2.1 well-known NAT64 prefix (only /96 is allowed: IPv4 in bits 96-127).
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
#: RFC 8215 local-use NAT64 prefix; the operator picks a /48../96 inside it (RFC 6052 §2.2).
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
#: RFC 4291 §2.5.5.1 IPv4-compatible addresses (deprecated, but still routed by some stacks).
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
#: RFC 2765 §2.1 IPv4-translated addresses ``::ffff:0:a.b.c.d`` (SIIT).
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_V4_MASK = 0xFFFFFFFF


def _rfc6052_candidates(value: int) -> tuple[int, ...]:
    """The IPv4 addresses (as ints) an address inside 64:ff9b:1::/48 may embed, one per prefix
    length the operator may have chosen (/48, /56, /64, /96; RFC 6052 §2.2: bits 64-71, the
    ``u`` octet, are skipped). The prefix length is not visible in the address, so all count."""

    def bits(start: int, length: int) -> int:
        return (value >> (128 - start - length)) & ((1 << length) - 1)

    return (
        (bits(48, 16) << 16) | bits(72, 16),  # /48
        (bits(56, 8) << 24) | bits(72, 24),  # /56
        bits(72, 32),  # /64
        value & _V4_MASK,  # /96
    )


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """Every IPv4 address ``ip`` carries in a form that routes to (or is treated as) it."""
    value = int(ip)
    found: list[int] = []
    if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d, RFC 4291 §2.5.5.2
        found.append(int(ip.ipv4_mapped))
    if ip in _NAT64_WELL_KNOWN:  # 64:ff9b::a.b.c.d, RFC 6052 §2.1
        found.append(value & _V4_MASK)
    if ip in _NAT64_LOCAL_USE:  # 64:ff9b:1::/48, RFC 8215 + RFC 6052 §2.2
        found.extend(_rfc6052_candidates(value))
    if ip in _IPV4_TRANSLATED:  # ::ffff:0:a.b.c.d, RFC 2765 §2.1
        found.append(value & _V4_MASK)
    if ip in _IPV4_COMPATIBLE and value > 1:  # ::a.b.c.d, RFC 4291 §2.5.5.1 (not :: or ::1)
        found.append(value & _V4_MASK)
    if ip.sixtofour is not None:  # 2002:aabb:ccdd::/48, RFC 3056 §2
        found.append(int(ip.sixtofour))
    if ip.teredo is not None:  # 2001::/32, RFC 4380 §4: (server, client)
        found.extend(int(v4) for v4 in ip.teredo)
    return tuple(ipaddress.IPv4Address(v) for v in found)


def is_forbidden_address(address: str, networks: Sequence[IPNetwork] = DEFAULT_NETWORKS) -> bool:
    """Whether ``address`` is in one of the refused ``networks``.

    Args:
        address: an IP literal as resolved or written in a URL host (``169.254.169.254``,
            ``fe80::1%eth0``; an IPv6 zone index is ignored). Anything that is not an IP
            literal (a host name, garbage) is not an address and yields False: host names are
            checked on the addresses they resolve to.
        networks: the refused networks (default :data:`DEFAULT_NETWORKS`, link-local and the
            clouds' metadata addresses).

    Returns:
        True when the address is in one of ``networks``, or when it is an IPv6 form that
        embeds an IPv4 address in one of the IPv4 ``networks``:

        * IPv4-mapped ``::ffff:a.b.c.d`` and IPv4-compatible ``::a.b.c.d`` (``::/96`` except
          ``::`` and ``::1``), RFC 4291 §2.5.5; IPv4-translated ``::ffff:0:a.b.c.d``,
          RFC 2765 §2.1;
        * NAT64 ``64:ff9b::a.b.c.d`` (RFC 6052 §2.1, last 32 bits) and the local-use prefix
          ``64:ff9b:1::/48`` (RFC 8215), where the IPv4 position depends on the prefix length
          the operator chose (RFC 6052 §2.2), so every possible position (/48, /56, /64, /96)
          is checked;
        * 6to4 ``2002:aabb:ccdd::/48``, the IPv4 in bits 16-47 (RFC 3056 §2);
        * Teredo ``2001::/32``, its server and (de-obfuscated) client IPv4 (RFC 4380 §4).

        An embedded IPv4 follows the IPv4 rule: ``::ffff:10.0.0.1`` and ``64:ff9b::808:808``
        (8.8.8.8) are allowed like 10.0.0.1 and 8.8.8.8. Pure, no I/O, never raises.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if any(ip.version == net.version and ip in net for net in networks):
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        v4_networks = [net for net in networks if net.version == 4]
        return any(v4 in net for v4 in _embedded_ipv4(ip) for net in v4_networks)
    return False


class _UnsafeAddressOSError(OSError):
    """Raised inside the resolver; aiohttp wraps OSErrors from resolution for us to unwrap."""


class _GuardedResolver(AbstractResolver):
    """Resolve with the thread-pool resolver, then refuse addresses in the refused networks.

    Args:
        networks: returns the refused networks in force (read at every resolution).
    """

    def __init__(self, networks: Callable[[], Sequence[IPNetwork]] = lambda: DEFAULT_NETWORKS
                 ) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self._networks = networks

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        networks = self._networks()
        bad = [r["host"] for r in results if is_forbidden_address(r["host"], networks)]
        if bad:
            log.debug("refused %s: it resolves to %s, in a refused network", host[:255], bad[0])
            raise _UnsafeAddressOSError(f"{host} resolves to refused address {bad[0]}")
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


@dataclass(frozen=True, slots=True)
class StreamResponse:
    """An HTTP response whose body is read as it arrives (:meth:`Transport.stream`).

    Attributes:
        status, headers, www_authenticate, url: as for :class:`Response`.
        chunks: the body, chunk by chunk (at most 64 KiB each); errors while reading raise
            the transport's errors (Timeout, ConnectionFailed).
    """

    status: int
    headers: Mapping[str, str]
    www_authenticate: tuple[str, ...]
    url: str
    chunks: AsyncIterator[bytes]


def _merged_headers(raw: Any) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in raw.items():
        key = name.lower()
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    return merged


#: The :class:`UnsafeAddress` message (our words: no host or address from the remote side).
REFUSED_ADDRESS_MESSAGE = "refusing to connect: the address is in a refused network"


def failure_words(exc: BaseException) -> str:
    """Our own words for a failed exchange, chosen by the exception's type only: the text of
    the exception is not used, since it may quote the remote side (an HTTP parser error
    quotes the status line a non-HTTP service sent; an OS error names the address connected
    to). Never raises."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | ssl.SSLCertVerificationError):
        return "TLS certificate not trusted"
    if isinstance(exc, aiohttp.ClientConnectorSSLError | ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc.os_error, socket.gaierror):
            return "host name not resolved"
        return "cannot connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer's body was cut short or malformed"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "the answer is not valid HTTP"
    if isinstance(exc, aiohttp.InvalidURL | ValueError):
        return "the URL or a header is not valid"
    return f"connection failed ({type(exc).__name__})"


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

    def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext | bool,
    ) -> contextlib.AbstractAsyncContextManager[StreamResponse]:
        """Send one request without following redirects and give the body as it arrives;
        leaving the context closes the connection if the body was not read to its end. No
        limit on the whole exchange's duration: connecting and each read have the timeout.

        Raises:
            Timeout, ConnectionFailed, UnsafeAddress.
        """
        ...

    async def aclose(self) -> None:
        """Close pooled connections."""
        ...


def _failure(method: str, netloc: str, exc: BaseException) -> UnsafeAddress | ConnectionFailed:
    """The error for a failed exchange: :class:`UnsafeAddress` when the resolver refused the
    address, else :class:`ConnectionFailed` in :func:`failure_words`; the exception's own
    text goes to the debug log only (bounded)."""
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, _UnsafeAddressOSError):
        return UnsafeAddress(REFUSED_ADDRESS_MESSAGE)
    log.debug("%s to %s failed: %s: %s", method, netloc[:255], type(exc).__name__,
              sanitize(str(exc)))
    return ConnectionFailed(f"{method} failed: {failure_words(exc)}")


def sanitize(text: str, limit: int = 200) -> str:
    """``text`` for a debug log line: printable ASCII only (others become ``?``), cut to
    ``limit`` characters."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text[: limit + 1])
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


class AiohttpTransport:
    """:class:`Transport` on one shared :class:`aiohttp.ClientSession` (created lazily inside
    the running loop), with connection reuse and the address guard.

    Args:
        timeout: seconds for the whole request, and separately for connecting and for each read.
        limit_per_host: pooled connections per host (the inspector's per-registry semaphore
            bounds concurrency; this only caps sockets).
        allow_link_local: disable the address guard (never in production).
        refused_networks: returns the refused networks in force, read at every connection
            (default: :data:`DEFAULT_NETWORKS`).
    """

    def __init__(
        self, *, timeout: float = 10.0, limit_per_host: int = 16, allow_link_local: bool = False,
        refused_networks: Callable[[], Sequence[IPNetwork]] | None = None,
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=timeout, sock_connect=timeout, sock_read=timeout
        )
        self._limit_per_host = limit_per_host
        self._allow_link_local = allow_link_local
        self._networks: Callable[[], Sequence[IPNetwork]] = (
            refused_networks or (lambda: DEFAULT_NETWORKS))
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self._limit_per_host,
                resolver=None if self._allow_link_local else _GuardedResolver(self._networks),
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
        if not self._allow_link_local and is_forbidden_address(host, self._networks()):
            log.debug("refused %s: a refused network", host[:255])
            raise UnsafeAddress(REFUSED_ADDRESS_MESSAGE)

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
                        raise TooLarge("the Content-Length is over the limit",
                                       status=resp.status)
                    buf = bytearray()
                    async for chunk in resp.content.iter_chunked(65536):
                        buf += chunk
                        if len(buf) > max_body:
                            raise TooLarge(f"more than {max_body} bytes read",
                                           status=resp.status)
                    body = bytes(buf)
                merged = _merged_headers(resp.headers)
                return Response(
                    resp.status,
                    merged,
                    tuple(resp.headers.getall("WWW-Authenticate", ())),
                    body,
                    url,
                )
        except TimeoutError as exc:
            raise Timeout(f"no answer to {method} within the timeout") from exc
        except (aiohttp.ClientError, OSError, ssl.SSLError, ValueError) as exc:
            raise _failure(method, netloc, exc) from None

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext | bool,
    ) -> AsyncIterator[StreamResponse]:
        """See :meth:`Transport.stream`."""
        self._check_literal(url)
        netloc = urlsplit(url).netloc
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.sock_connect,
                                        sock_read=self._timeout.sock_read)

        async def chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
            async for chunk in resp.content.iter_chunked(65536):
                yield chunk

        try:
            async with session.request(method, url, headers=dict(headers),
                                       allow_redirects=False, ssl=ssl_context,
                                       timeout=timeout) as resp:
                yield StreamResponse(resp.status, _merged_headers(resp.headers),
                                     tuple(resp.headers.getall("WWW-Authenticate", ())),
                                     url, chunks(resp))
        except TimeoutError as exc:
            raise Timeout(f"no data for {method} within the timeout") from exc
        except (aiohttp.ClientError, OSError, ssl.SSLError, ValueError) as exc:
            raise _failure(method, netloc, exc) from None

    async def aclose(self) -> None:
        """See :meth:`Transport.aclose`."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
            # Let SSL transports finish closing (aiohttp's documented graceful-shutdown pause).
            await asyncio.sleep(0)
        self._session = None
