"""Registry authentication: ``WWW-Authenticate`` challenges and bearer token responses.

Sources: RFC 7235 challenge syntax; Docker registry token authentication (``Bearer
realm="...",service="...",scope="repository:<name>:pull"``; the token server answers
``{"token": ..., "access_token": ..., "expires_in": seconds}``, ``expires_in`` defaulting to 60;
OAuth2 ``grant_type=refresh_token`` for identity tokens).
Pure functions; the inspector does the I/O.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from urllib.parse import urlencode

from podplacement.imageinspect._credentials import Credential

_PARAM_RE = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')
DEFAULT_TOKEN_TTL = 60.0
#: Longest bearer token accepted (characters); the big registries' JWTs are 1-4 KiB.
MAX_TOKEN_LENGTH = 16384
_TOKEN_RE = re.compile(r"[!-~]+")
#: Refresh tokens this many seconds before they expire.
TOKEN_EXPIRY_MARGIN = 5.0


@dataclass(frozen=True, slots=True)
class Challenge:
    """One parsed authentication challenge.

    Attributes:
        scheme: lower-cased scheme, ``basic`` or ``bearer`` (others are kept but unusable).
        realm: the ``realm`` parameter (a token URL for bearer).
        service: the bearer ``service`` parameter, or ``""``.
        scope: the ``scope`` parameter the registry asked for, or ``""``.
        error: the ``error`` parameter (``insufficient_scope``, ``invalid_token``), or ``""``.
    """

    scheme: str
    realm: str = ""
    service: str = ""
    scope: str = ""
    error: str = ""


def parse_challenges(values: tuple[str, ...] | list[str]) -> list[Challenge]:
    """Parse ``WWW-Authenticate`` header values into challenges (Bearer first, then Basic).

    Unknown schemes and malformed parameters are skipped rather than raising.
    """
    out: list[Challenge] = []
    for value in values:
        rest = value.strip()
        while rest:
            m = re.match(r"([A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*)\s*", rest)
            if not m:
                break
            scheme = m.group(1).lower()
            rest = rest[m.end() :]
            params: dict[str, str] = {}
            while True:
                pm = _PARAM_RE.match(rest)
                if not pm:
                    break
                quoted, bare = pm.group(2), pm.group(3)
                raw = quoted if quoted is not None else bare or ""
                params[pm.group(1).lower()] = re.sub(r"\\(.)", r"\1", raw)
                rest = rest[pm.end() :]
            out.append(
                Challenge(
                    scheme,
                    params.get("realm", ""),
                    params.get("service", ""),
                    params.get("scope", ""),
                    params.get("error", ""),
                )
            )
            rest = rest.lstrip(", ")
    order = {"bearer": 0, "basic": 1}
    return sorted(out, key=lambda c: order.get(c.scheme, 2))


def basic_header(credential: Credential) -> str:
    """``Authorization`` value for Basic auth with the credential's username and password."""
    raw = f"{credential.username}:{credential.password}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def pull_scope(repository_path: str) -> str:
    """The token scope for pulling ``repository_path`` (``repository:<path>:pull``)."""
    return f"repository:{repository_path}:pull"


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """How to ask a token server for a token.

    Attributes:
        method: ``GET`` (Basic or anonymous) or ``POST`` (OAuth2 refresh-token grant).
        url: the realm URL, with the query for ``GET``.
        headers: request headers (may hold ``Authorization``; never log them).
        body: form body for ``POST``, else ``None``.
    """

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None = None


def token_request(challenge: Challenge, scope: str, credential: Credential | None) -> TokenRequest:
    """Build the token request for a bearer challenge (Docker token spec).

    With an identity token: ``POST`` form ``grant_type=refresh_token`` (OAuth2, docker's
    ``identitytoken``); with a username/password: ``GET`` with Basic auth; else anonymous ``GET``.
    """
    if credential is not None and credential.identity_token:
        form = {
            "grant_type": "refresh_token",
            "refresh_token": credential.identity_token,
            "service": challenge.service,
            "scope": scope,
            "client_id": "podplacement",
        }
        return TokenRequest(
            "POST",
            challenge.realm,
            {"Content-Type": "application/x-www-form-urlencoded"},
            urlencode(form).encode(),
        )
    query = {k: v for k, v in (("service", challenge.service), ("scope", scope)) if v}
    sep = "&" if "?" in challenge.realm else "?"
    url = challenge.realm + (sep + urlencode(query) if query else "")
    headers = {}
    if credential is not None and (credential.username or credential.password):
        headers["Authorization"] = basic_header(credential)
    return TokenRequest("GET", url, headers)


def parse_token_response(body: bytes) -> tuple[str, float]:
    """Decode a token server answer into ``(token, lifetime_seconds)``.

    ``token`` is preferred, ``access_token`` accepted; ``expires_in`` defaults to 60 seconds.

    Raises:
        ValueError: not JSON, neither ``token`` nor ``access_token`` is a non-empty string,
            or the token is longer than :data:`MAX_TOKEN_LENGTH` or has characters other
            than visible ASCII (it is sent as a header value).
    """
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"token response is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("token response is not a JSON object")
    token = doc.get("token") or doc.get("access_token")
    if not isinstance(token, str) or not token:
        raise ValueError("token response has neither 'token' nor 'access_token'")
    if len(token) > MAX_TOKEN_LENGTH or not _TOKEN_RE.fullmatch(token):
        # It becomes an Authorization header: no spaces, control characters or line breaks.
        raise ValueError(
            f"the token is not 1..{MAX_TOKEN_LENGTH} visible ASCII characters without spaces")
    expires = doc.get("expires_in")
    lifetime = (
        float(expires)
        if isinstance(expires, int | float) and not isinstance(expires, bool) and expires > 0
        else DEFAULT_TOKEN_TTL
    )
    return token, lifetime
