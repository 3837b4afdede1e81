"""Registry credentials from Kubernetes pull secrets and docker ``config.json``, matched to an
image with the kubelet's keyring rules.

Matching follows the kubelet's ``pkg/credentialprovider`` keyring: a config key is read as a
schemeless URL (``https://`` and ``http://`` are stripped, a leading ``/v1/`` or ``/v2/`` path
means the bare host); it matches an image repository (``docker.io/library/nginx``) when the
host has the same number of dot-separated labels and each label matches as a glob (``*``,
``?``, ``[...]``), the ports are equal and the key's path is a string prefix of the image's
path. Matching keys are tried in reverse lexical order (so ``quay.io/org`` comes before
``quay.io``), several credentials under one key in the order given; when nothing matches, a
Docker Hub image uses the ``index.docker.io`` key. Anonymous access is tried last by the caller.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from podplacement.imageinspect._errors import CredentialError

DOCKERCONFIGJSON_TYPE = "kubernetes.io/dockerconfigjson"
DOCKERCFG_TYPE = "kubernetes.io/dockercfg"
_DEFAULT_REGISTRY_KEY = "index.docker.io"


@dataclass(frozen=True, slots=True, repr=False)
class Credential:
    """One registry login.

    Attributes:
        pattern: the normalised config key (``host[:port][/path]``, host labels may be globs).
        username, password: Basic credentials (also sent to bearer token servers).
        identity_token: an OAuth2 refresh token (docker ``identitytoken``), used instead of the
            password at token servers.

    ``repr()`` shows the pattern and :attr:`identity`, never a secret.
    """

    pattern: str
    username: str = field(default="", compare=True)
    password: str = field(default="", compare=True)
    identity_token: str = field(default="", compare=True)

    @property
    def identity(self) -> str:
        """A stable hash of the secret material (16 hex digits); equal logins share it, and it
        is what cache keys hold instead of the secret."""
        material = "\0".join((self.username, self.password, self.identity_token))
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Credential(pattern={self.pattern!r}, identity={self.identity!r})"

    __str__ = __repr__

    def matches(self, repository: str) -> bool:
        """True when :attr:`pattern` matches ``repository`` (``domain/path``), kubelet rules."""
        return urls_match(self.pattern, repository)


def normalize_key(key: str) -> str:
    """Turn a docker config key into the kubelet's keyring key.

    ``https://index.docker.io/v1/`` → ``index.docker.io``; ``quay.io/org/`` → ``quay.io/org``.
    """
    value = key.strip()
    if not value.startswith(("https://", "http://")):
        value = "https://" + value
    parsed = urlsplit(value)
    path = parsed.path
    if path.startswith(("/v1/", "/v2/")):
        path = path[3:]
    path = path.rstrip("/") if path not in ("", "/") else ""
    return parsed.netloc + path


def _glob_to_regex(glob: str) -> re.Pattern[str]:
    """Go ``filepath.Match`` semantics for one host label (no separators inside a label)."""
    out = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = glob.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j]
                if body.startswith("^"):
                    body = "!" + body[1:]
                if body.startswith("!"):
                    out.append("[^" + body[1:].replace("\\", "\\\\") + "]")
                else:
                    out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def _split(url: str) -> tuple[list[str], str, str]:
    """Split a schemeless ``host[:port][/path]`` into host labels, port and path.

    Done by hand rather than with a URL parser so that glob characters (``?``, ``[``) stay
    part of the host pattern instead of starting a query or an IPv6 literal.
    """
    netloc, slash, path = url.partition("/")
    path = slash + path
    host, port = netloc, ""
    if netloc.startswith("[") and "]" in netloc:
        end = netloc.index("]")
        host, rest = netloc[: end + 1], netloc[end + 1 :]
        port = rest[1:] if rest.startswith(":") else ""
    else:
        head, colon, tail = netloc.rpartition(":")
        if colon and tail.isdigit():
            host, port = head, tail
    return host.split("."), port, path


def urls_match(glob: str, target: str) -> bool:
    """The kubelet's ``URLsMatch``: host labels glob-match one to one, ports equal, glob path
    is a prefix of the target path. Both arguments are schemeless (``host[:port][/path]``)."""
    glob_parts, glob_port, glob_path = _split(glob)
    target_parts, target_port, target_path = _split(target)
    if glob_port != target_port or len(glob_parts) != len(target_parts):
        return False
    if not target_path.startswith(glob_path):
        return False
    try:
        return all(
            _glob_to_regex(g).fullmatch(t) is not None
            for g, t in zip(glob_parts, target_parts, strict=True)
        )
    except re.error:
        return False


def _is_default_registry(repository: str) -> bool:
    first, sep, _ = repository.partition("/")
    if not first:
        return False
    if not sep or first in ("docker.io", "index.docker.io"):
        return True
    return not any(c in first for c in ".:")


def match_credentials(repository: str, credentials: Sequence[Credential]) -> list[Credential]:
    """Credentials to try for ``repository`` (``domain/path``), most specific key first.

    Keys are ordered in reverse lexical order; credentials sharing a key keep their given
    order; equal logins (same :attr:`Credential.identity`) appear once. When no key matches
    and the repository is on Docker Hub, credentials for ``index.docker.io`` are returned.
    The caller tries anonymous access after these (kubelet behaviour).
    """
    by_key: dict[str, list[Credential]] = {}
    for cred in credentials:
        by_key.setdefault(cred.pattern, []).append(cred)
    ordered: list[Credential] = []
    for key in sorted(by_key, reverse=True):
        if urls_match(key, repository):
            ordered.extend(by_key[key])
    if not ordered and _is_default_registry(repository):
        ordered = list(by_key.get(_DEFAULT_REGISTRY_KEY, []))
    seen: set[str] = set()
    unique = []
    for cred in ordered:
        if cred.identity not in seen:
            seen.add(cred.identity)
            unique.append(cred)
    return unique


def _entry_to_credential(key: str, entry: Any) -> Credential | None:
    if not isinstance(entry, Mapping):
        raise CredentialError(f"docker config entry {key!r} is not an object")
    username = str(entry.get("username") or "")
    password = str(entry.get("password") or "")
    auth = entry.get("auth")
    if auth:
        try:
            decoded = base64.b64decode(str(auth), validate=False).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise CredentialError(f"docker config entry {key!r}: 'auth' is not base64") from exc
        if ":" not in decoded:
            raise CredentialError(f"docker config entry {key!r}: 'auth' is not user:password")
        username, password = decoded.split(":", 1)
    identity_token = str(entry.get("identitytoken") or "")
    if not (username or password or identity_token):
        return None
    return Credential(normalize_key(key), username, password, identity_token)


def credentials_from_docker_config(cfg: Mapping[str, Any]) -> list[Credential]:
    """Credentials from a docker ``config.json`` document (``{"auths": {key: entry}}``) or a
    legacy ``.dockercfg`` map (``{key: entry}``; values that are not objects are skipped).

    An entry has ``auth`` (base64 ``user:password``, which wins) or ``username``/``password``,
    and optionally ``identitytoken``. Entries with nothing usable are skipped.

    Raises:
        CredentialError: an entry is not an object or its ``auth`` cannot be decoded.
    """
    legacy = "auths" not in cfg
    auths = cfg if legacy else cfg.get("auths")
    if not isinstance(auths, Mapping):
        raise CredentialError("docker config 'auths' is not an object")
    out = []
    for key, entry in auths.items():
        if legacy and not isinstance(entry, Mapping):
            continue  # other config.json settings (credsStore, currentContext, ...)
        cred = _entry_to_credential(str(key), entry)
        if cred is not None:
            out.append(cred)
    return out


def _secret_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    data = secret.get("data") or {}
    if isinstance(data, Mapping) and key in data:
        try:
            return base64.b64decode(str(data[key]))
        except binascii.Error as exc:
            raise CredentialError(f"secret data {key!r} is not base64") from exc
    string_data = secret.get("stringData") or {}
    if isinstance(string_data, Mapping) and key in string_data:
        return str(string_data[key]).encode()
    return None


def credentials_from_pull_secrets(secrets: Iterable[Mapping[str, Any]]) -> list[Credential]:
    """Credentials from Kubernetes Secret objects (plain dicts as the API returns them).

    ``kubernetes.io/dockerconfigjson`` secrets are read from ``data[".dockerconfigjson"]``
    (base64 of ``{"auths": ...}``); legacy ``kubernetes.io/dockercfg`` secrets from
    ``data[".dockercfg"]``. Other secret types are ignored, as the kubelet does. Order is kept.

    Raises:
        CredentialError: the payload is not base64 JSON of the expected shape (names the secret).
    """
    out: list[Credential] = []
    for secret in secrets:
        kind = secret.get("type")
        name = (secret.get("metadata") or {}).get("name", "?")
        if kind == DOCKERCONFIGJSON_TYPE:
            key = ".dockerconfigjson"
        elif kind == DOCKERCFG_TYPE:
            key = ".dockercfg"
        else:
            continue
        raw = _secret_bytes(secret, key)
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CredentialError(f"secret {name!r}: {key} is not JSON") from exc
        if not isinstance(doc, Mapping):
            raise CredentialError(f"secret {name!r}: {key} is not a JSON object")
        if kind == DOCKERCONFIGJSON_TYPE and "auths" not in doc:
            continue
        try:
            out.extend(credentials_from_docker_config(doc))
        except CredentialError as exc:
            raise CredentialError(f"secret {name!r}: {exc}") from exc
    return out
