"""Kubelet image credential providers, the pure part: the ``CredentialProviderConfig``, which
provider applies to an image, the exec protocol's request and response, the response cache.

The rules are the kubelet's (``pkg/credentialprovider/plugin/plugin.go``, its config
validation, and the kubernetes.io pages "Configure a kubelet image credential provider",
"Kubelet Configuration (v1)" ``CredentialProviderConfig`` and "Kubelet CredentialProvider
(v1)"):

- a provider applies to an image when one of its ``matchImages`` matches the image's
  repository (``host[:port]/path``, no tag or digest) with the keyring's ``URLsMatch``
  (:func:`imageinspect.urls_match`: the same number of host labels, each a glob, equal ports,
  the pattern's path a prefix of the image's);
- the response's ``cacheKeyType`` keys its cache entry: ``Image`` (the repository),
  ``Registry`` (the host and port, the first path segment) or ``Global``; a lookup tries
  the image, then the registry, then the global key. ``cacheDuration`` absent: the
  provider's ``defaultCacheDuration``; zero (either way): not cached;
- in ServiceAccount-token mode (``tokenAttributes.serviceAccountTokenAudience``) each key
  also holds the pod's ServiceAccount (namespace, name, uid, the annotations passed), so an
  entry is never used for another ServiceAccount, let alone another namespace;
- the ``auth`` map becomes credentials keyed by its keys, matched to the image by the
  keyring's rule (:func:`imageinspect.match_credentials`: reverse lexical order, the most
  specific key first); when several providers answer for one image, an earlier provider's
  key wins over the same key of a later one.

Everything here is data in, data out; the exec and the API calls live in
:mod:`imageinspect._provider_exec` and the controller.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podplacement.imageinspect._credentials import Credential, normalize_key, urls_match
from podplacement.imageinspect._errors import CredentialError

CONFIG_API_VERSION = "kubelet.config.k8s.io/v1"
CONFIG_KIND = "CredentialProviderConfig"
#: Exec protocol versions the kubelet accepts; tokenAttributes only with v1.
PROVIDER_API_VERSIONS = (
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
)
CACHE_KEY_TYPES = ("Image", "Registry", "Global")
SA_CACHE_TYPES = ("ServiceAccount", "Token")

#: Bounds on what the config may hold (it is the operator's, still bounded).
MAX_PROVIDERS = 32
MAX_MATCH_IMAGES = 256
MAX_ARGS = 64
MAX_ENV = 64
MAX_FIELD_CHARS = 4096
#: Bounds on a plugin's answer.
MAX_RESPONSE_BYTES = 1 << 20
MAX_AUTH_ENTRIES = 256
#: Cache entries kept at the most (the cache is pruned of expired entries, then emptied).
MAX_CACHE_ENTRIES = 10_000
#: The kubelet's catch-all exec timeout (plugin.go), seconds.
DEFAULT_EXEC_TIMEOUT = 60.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,252}")
_ANNOTATION_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
          "m": 60.0, "h": 3600.0}


class ProviderConfigError(CredentialError):
    """The ``CredentialProviderConfig`` cannot be used (one line naming the field)."""


class ProviderResponseError(CredentialError):
    """A plugin's answer cannot be used (never quotes the answer: it may hold secrets)."""


def parse_duration(value: object, what: str = "duration") -> float:
    """A Go ``time.Duration`` string (``12h``, ``1h30m``, ``500ms``, ``0s``, ``0``) → seconds.

    Raises:
        ProviderConfigError: not a duration, or negative.
    """
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ProviderConfigError(f"{what} must be a duration such as '5m' or '0s'")
    text = value
    if text.startswith("-"):
        raise ProviderConfigError(f"{what} must not be negative")
    text = text.lstrip("+")
    if text == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise ProviderConfigError(f"{what} {value[:64]!r} is not a duration such as '5m'")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ProviderConfigError(f"{what} {value[:64]!r} is not a duration such as '5m'")
    return total


@dataclass(frozen=True, slots=True)
class TokenAttributes:
    """``tokenAttributes`` of a provider (KEP-4412, ServiceAccount-token mode).

    Attributes:
        audience: ``serviceAccountTokenAudience``, the token's audience.
        require_service_account: ``requireServiceAccount``: without a ServiceAccount the
            plugin is not run.
        required_annotation_keys: annotations of the ServiceAccount passed to the plugin; one
            missing: the plugin is not run.
        optional_annotation_keys: annotations passed when present.
        cache_type: ``cacheType``: ``ServiceAccount`` (entries keyed by the ServiceAccount)
            or ``Token`` (keyed by the token too: in effect one run per pod).
    """

    audience: str
    require_service_account: bool
    required_annotation_keys: tuple[str, ...] = ()
    optional_annotation_keys: tuple[str, ...] = ()
    cache_type: str = "ServiceAccount"


@dataclass(frozen=True, slots=True)
class CredentialProvider:
    """One provider of the config.

    Attributes:
        name: the executable's name in the bin directory (no ``/``, not ``.``/``..``).
        match_images: the ``matchImages`` patterns (``host[:port][/path]``, host labels
            may be globs).
        default_cache_duration: seconds (``defaultCacheDuration``).
        api_version: the exec protocol version (:data:`PROVIDER_API_VERSIONS`).
        args: arguments after the executable.
        env: (name, value) pairs added to the controller's environment.
        token_attributes: ServiceAccount-token mode, or None.
    """

    name: str
    match_images: tuple[str, ...]
    default_cache_duration: float
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    token_attributes: TokenAttributes | None = None

    def applies_to(self, repository: str) -> bool:
        """True when one of :attr:`match_images` matches ``repository`` (``host/path``)."""
        return any(urls_match(pattern, repository) for pattern in self.match_images)


def _text(value: object, what: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ProviderConfigError(f"{what} must be a non-empty string")
    if len(value) > MAX_FIELD_CHARS:
        raise ProviderConfigError(f"{what} is longer than {MAX_FIELD_CHARS} characters")
    return value


def _list(value: object, what: str, bound: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProviderConfigError(f"{what} must be a list")
    if len(value) > bound:
        raise ProviderConfigError(f"{what} has more than {bound} entries")
    return value


def _match_image(value: object, what: str) -> str:
    text = _text(value, what)
    if "://" in text or any(c.isspace() for c in text):
        raise ProviderConfigError(f"{what} {text[:64]!r} must be host[:port][/path], no scheme")
    host = text.partition("/")[0]
    if not host or host.startswith(".") or ".." in host:
        raise ProviderConfigError(f"{what} {text[:64]!r} has no usable host")
    return text


def _token_attributes(raw: object, what: str, api_version: str) -> TokenAttributes | None:
    if raw is None:
        return None
    if api_version != PROVIDER_API_VERSIONS[0]:
        raise ProviderConfigError(f"{what} needs apiVersion {PROVIDER_API_VERSIONS[0]}")
    if not isinstance(raw, Mapping):
        raise ProviderConfigError(f"{what} must be an object")
    audience = _text(raw.get("serviceAccountTokenAudience"),
                     f"{what}.serviceAccountTokenAudience")
    require = raw.get("requireServiceAccount")
    if not isinstance(require, bool):
        raise ProviderConfigError(f"{what}.requireServiceAccount must be true or false")
    keys: dict[str, tuple[str, ...]] = {}
    for field_name in ("requiredServiceAccountAnnotationKeys",
                       "optionalServiceAccountAnnotationKeys"):
        values = []
        for i, key in enumerate(_list(raw.get(field_name), f"{what}.{field_name}", 64)):
            k = _text(key, f"{what}.{field_name}[{i}]")
            if not _ANNOTATION_KEY.fullmatch(k) or len(k) > 316:
                raise ProviderConfigError(f"{what}.{field_name}[{i}] is not an annotation key")
            if k in values:
                raise ProviderConfigError(f"{what}.{field_name} lists {k!r} twice")
            values.append(k)
        keys[field_name] = tuple(values)
    both = set(keys["requiredServiceAccountAnnotationKeys"]) & set(
        keys["optionalServiceAccountAnnotationKeys"])
    if both:
        raise ProviderConfigError(f"{what}: {sorted(both)[0]!r} is both required and optional")
    if keys["requiredServiceAccountAnnotationKeys"] and not require:
        raise ProviderConfigError(
            f"{what}: requiredServiceAccountAnnotationKeys needs requireServiceAccount: true")
    cache_type = raw.get("cacheType", "ServiceAccount")
    if cache_type not in SA_CACHE_TYPES:
        raise ProviderConfigError(f"{what}.cacheType must be one of {', '.join(SA_CACHE_TYPES)}")
    return TokenAttributes(audience, require, keys["requiredServiceAccountAnnotationKeys"],
                           keys["optionalServiceAccountAnnotationKeys"], str(cache_type))


def _provider(raw: object, what: str) -> CredentialProvider:
    if not isinstance(raw, Mapping):
        raise ProviderConfigError(f"{what} must be an object")
    name = _text(raw.get("name"), f"{what}.name")
    if name in (".", "..") or not _NAME.fullmatch(name):
        raise ProviderConfigError(f"{what}.name {name[:64]!r} must be a file name "
                                  "(letters, digits, '.', '_', '-'; no '/')")
    images = tuple(_match_image(v, f"{what}.matchImages[{i}]") for i, v in enumerate(
        _list(raw.get("matchImages"), f"{what}.matchImages", MAX_MATCH_IMAGES)))
    if not images:
        raise ProviderConfigError(f"{what}.matchImages must list at least one pattern")
    if raw.get("defaultCacheDuration") is None:
        raise ProviderConfigError(f"{what}.defaultCacheDuration is required")
    duration = parse_duration(raw.get("defaultCacheDuration"), f"{what}.defaultCacheDuration")
    api_version = _text(raw.get("apiVersion"), f"{what}.apiVersion")
    if api_version not in PROVIDER_API_VERSIONS:
        raise ProviderConfigError(f"{what}.apiVersion must be one of "
                                  f"{', '.join(PROVIDER_API_VERSIONS)}")
    args = tuple(_text(a, f"{what}.args[{i}]", required=False) for i, a in enumerate(
        _list(raw.get("args"), f"{what}.args", MAX_ARGS)))
    env = []
    for i, item in enumerate(_list(raw.get("env"), f"{what}.env", MAX_ENV)):
        if not isinstance(item, Mapping):
            raise ProviderConfigError(f"{what}.env[{i}] must be an object with name and value")
        env_name = _text(item.get("name"), f"{what}.env[{i}].name")
        if not _ENV_NAME.fullmatch(env_name):
            raise ProviderConfigError(f"{what}.env[{i}].name is not a variable name")
        env.append((env_name, _text(item.get("value"), f"{what}.env[{i}].value",
                                    required=False)))
    attrs = _token_attributes(raw.get("tokenAttributes"), f"{what}.tokenAttributes",
                              api_version)
    return CredentialProvider(name, images, duration, api_version, args, tuple(env), attrs)


def parse_provider_config(doc: object) -> tuple[CredentialProvider, ...]:
    """The providers of a ``CredentialProviderConfig`` document (the decoded YAML/JSON).

    Checked as the kubelet checks it: ``apiVersion`` ``kubelet.config.k8s.io/v1`` (or
    v1beta1/v1alpha1), ``kind`` ``CredentialProviderConfig``, at least one provider, names
    unique file names, ``matchImages`` non-empty, ``defaultCacheDuration`` present and not
    negative, a known exec ``apiVersion``, ``tokenAttributes`` only with v1 and with an
    audience and ``requireServiceAccount``.

    Raises:
        ProviderConfigError: the first problem, one line naming the field.
    """
    if not isinstance(doc, Mapping):
        raise ProviderConfigError("the credential provider config is not an object")
    if doc.get("kind") != CONFIG_KIND:
        raise ProviderConfigError(f"kind must be {CONFIG_KIND}")
    if doc.get("apiVersion") not in (CONFIG_API_VERSION, "kubelet.config.k8s.io/v1beta1",
                                     "kubelet.config.k8s.io/v1alpha1"):
        raise ProviderConfigError(f"apiVersion must be {CONFIG_API_VERSION}")
    raw = _list(doc.get("providers"), "providers", MAX_PROVIDERS)
    if not raw:
        raise ProviderConfigError("providers must list at least one provider")
    providers = tuple(_provider(p, f"providers[{i}]") for i, p in enumerate(raw))
    names = [p.name for p in providers]
    for name in names:
        if names.count(name) > 1:
            raise ProviderConfigError(f"provider name {name!r} is used twice")
    return providers


def load_provider_config(text: str | bytes) -> tuple[CredentialProvider, ...]:
    """:func:`parse_provider_config` of a YAML or JSON text (the file the operator mounts).

    Raises:
        ProviderConfigError: not YAML, or not a valid config.
    """
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ProviderConfigError(f"the credential provider config is not YAML{where}") from exc
    return parse_provider_config(doc)


def providers_for(providers: Sequence[CredentialProvider],
                  repository: str) -> list[CredentialProvider]:
    """The providers that apply to ``repository`` (``host[:port]/path``), in config order."""
    return [p for p in providers if p.applies_to(repository)]


def build_request(api_version: str, image: str, *, token: str = "",
                  annotations: Mapping[str, str] | None = None) -> bytes:
    """The ``CredentialProviderRequest`` JSON sent on the plugin's stdin: ``image`` always,
    ``serviceAccountToken`` and ``serviceAccountAnnotations`` in token mode."""
    request: dict[str, Any] = {"apiVersion": api_version, "kind": "CredentialProviderRequest",
                               "image": image}
    if token:
        request["serviceAccountToken"] = token
    if annotations:
        request["serviceAccountAnnotations"] = dict(annotations)
    return json.dumps(request, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True, repr=False)
class ProviderResponse:
    """A decoded ``CredentialProviderResponse``.

    Attributes:
        cache_key_type: ``Image``, ``Registry`` or ``Global``.
        cache_duration: seconds, or None when the plugin gave none (use the default).
        credentials: one :class:`Credential` per ``auth`` key (pattern = the key,
            normalised), in the answer's order.
    """

    cache_key_type: str
    cache_duration: float | None
    credentials: tuple[Credential, ...] = field(default=())

    def __repr__(self) -> str:
        return (f"ProviderResponse(cache_key_type={self.cache_key_type!r}, "
                f"cache_duration={self.cache_duration!r}, credentials={self.credentials!r})")


def parse_response(data: bytes, api_version: str) -> ProviderResponse:
    """Decode a plugin's stdout (at most :data:`MAX_RESPONSE_BYTES`, at most
    :data:`MAX_AUTH_ENTRIES` ``auth`` keys). Its ``apiVersion`` must equal the request's,
    ``kind`` be ``CredentialProviderResponse``, ``cacheKeyType`` one of
    :data:`CACHE_KEY_TYPES`; an ``auth`` key that is not a usable ``host[/path]`` is dropped.

    Raises:
        ProviderResponseError: the answer is unusable (the message never quotes it).
    """
    if len(data) > MAX_RESPONSE_BYTES:
        raise ProviderResponseError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProviderResponseError("the answer is not JSON") from exc
    if not isinstance(doc, dict):
        raise ProviderResponseError("the answer is not a JSON object")
    if doc.get("apiVersion") != api_version:
        raise ProviderResponseError(f"the answer's apiVersion is not {api_version}")
    if doc.get("kind") != "CredentialProviderResponse":
        raise ProviderResponseError("the answer's kind is not CredentialProviderResponse")
    key_type = doc.get("cacheKeyType")
    if key_type not in CACHE_KEY_TYPES:
        raise ProviderResponseError("the answer's cacheKeyType is not Image, Registry or Global")
    duration: float | None = None
    if doc.get("cacheDuration") is not None:
        try:
            duration = parse_duration(doc.get("cacheDuration"), "cacheDuration")
        except ProviderConfigError as exc:
            raise ProviderResponseError("the answer's cacheDuration is not a duration") from exc
    auth = doc.get("auth") or {}
    if not isinstance(auth, dict):
        raise ProviderResponseError("the answer's auth is not an object")
    if len(auth) > MAX_AUTH_ENTRIES:
        raise ProviderResponseError(f"the answer has more than {MAX_AUTH_ENTRIES} auth keys")
    creds = []
    for key, entry in auth.items():
        if not isinstance(entry, dict) or not isinstance(key, str) or not key:
            raise ProviderResponseError("an auth entry is not an object")
        username, password = entry.get("username", ""), entry.get("password", "")
        if not isinstance(username, str) or not isinstance(password, str):
            raise ProviderResponseError("an auth entry's username or password is not a string")
        pattern = normalize_key(key)
        if not pattern or any(c.isspace() for c in pattern) or len(pattern) > 1024:
            continue
        creds.append(Credential(pattern, username, password))
    return ProviderResponse(str(key_type), duration, tuple(creds))


def registry_of(repository: str) -> str:
    """The registry part of a repository, as the kubelet's ``parseRegistry`` takes it: the
    text before the first ``/`` (``host[:port]``)."""
    return repository.split("/", 1)[0]


def service_account_key(namespace: str, name: str, uid: str,
                        annotations: Mapping[str, str]) -> str:
    """The ServiceAccount part of a cache key (namespace, name, uid and the annotations
    passed, sorted), length-prefixed so that no two different inputs give one key."""
    parts = [namespace, name, uid]
    for k in sorted(annotations):
        parts += [k, annotations[k]]
    return "".join(f"{len(p)}:{p}" for p in parts)


def token_hash(token: str) -> str:
    """``sha256:<hex>`` of a token (what a ``Token`` cache key holds instead of the token)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest() if token else ""


def cache_key(base: str, sa_key: str = "") -> str:
    """One cache key: the base (repository, registry or ``global``) and the ServiceAccount
    part, length-prefixed."""
    return f"{len(base)}:{base}{len(sa_key)}:{sa_key}"


def entry_key(response: ProviderResponse, repository: str, sa_key: str = "") -> str:
    """The cache key a response is stored under (by its ``cacheKeyType``)."""
    if response.cache_key_type == "Image":
        base = repository
    elif response.cache_key_type == "Registry":
        base = registry_of(repository)
    else:
        base = "global"
    return cache_key(base, sa_key)


def lookup_keys(repository: str, sa_key: str = "") -> tuple[str, str, str]:
    """The keys a lookup tries, in order: the image, its registry, global (kubelet order)."""
    return (cache_key(repository, sa_key), cache_key(registry_of(repository), sa_key),
            cache_key("global", sa_key))


def expiry(response: ProviderResponse, default_duration: float, now: float) -> float | None:
    """When the response's entry expires (monotonic seconds), or None: not cached (a zero
    ``cacheDuration``, or none given and a zero ``defaultCacheDuration``)."""
    duration = response.cache_duration
    if duration is None:
        duration = default_duration
    if duration <= 0:
        return None
    return now + duration


class ResponseCache:
    """The provider answers, per key, until they expire (a plain dict; the caller passes the
    time). Bounded at :data:`MAX_CACHE_ENTRIES`: expired entries are dropped first, then
    everything."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, tuple[Credential, ...]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, repository: str, sa_key: str, now: float) -> tuple[Credential, ...] | None:
        """The credentials cached for ``repository`` (image, registry, then global key), or
        None when nothing live is cached."""
        for key in lookup_keys(repository, sa_key):
            hit = self._entries.get(key)
            if hit is None:
                continue
            if hit[0] <= now:
                del self._entries[key]
                continue
            return hit[1]
        return None

    def put(self, key: str, credentials: tuple[Credential, ...], expires_at: float,
            now: float) -> None:
        """Store ``credentials`` under ``key`` until ``expires_at``."""
        if len(self._entries) >= MAX_CACHE_ENTRIES:
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            if len(self._entries) >= MAX_CACHE_ENTRIES:
                self._entries.clear()
        self._entries[key] = (expires_at, credentials)


def merge_provider_credentials(
        answers: Sequence[Sequence[Credential]]) -> list[Credential]:
    """The credentials of several providers for one image, in config order; a key an
    earlier provider answered is dropped from later answers (the earlier value wins)."""
    seen: set[str] = set()
    out: list[Credential] = []
    for answer in answers:
        keys = {c.pattern for c in answer}
        out.extend(c for c in answer if c.pattern not in seen)
        seen |= keys
    return out
