"""Registry configuration in the containers-registries.conf(5) version 2 TOML format.

Supported: ``[[registry]]`` tables with ``prefix`` (defaults to ``location``; may start with
``*.`` to match subdomains), ``location``, ``insecure``, ``blocked``, ``mirror-by-digest-only``
and ``[[registry.mirror]]`` entries with ``location``, ``insecure`` and ``pull-from-mirror``
(``all``, ``digest-only``, ``tag-only``). The longest matching prefix wins; a match only counts
at a boundary (the reference continues with ``/``, ``:`` or ``@``), as in containers/image.
Pull sources are the usable mirrors in order, then the (possibly rewritten) location.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from podplacement.imageinspect._errors import Blocked, InvalidReference, RegistriesConfigError
from podplacement.imageinspect._reference import Reference, parse_reference

_PULL_FROM_MIRROR = ("all", "digest-only", "tag-only")


@dataclass(frozen=True, slots=True)
class Mirror:
    """A ``[[registry.mirror]]`` entry.

    Attributes:
        location: ``host[:port][/path]`` replacing the matched prefix.
        insecure: allow plain HTTP / unverified TLS.
        pull_from_mirror: ``all``, ``digest-only`` or ``tag-only``.
    """

    location: str
    insecure: bool = False
    pull_from_mirror: str = "all"


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """A ``[[registry]]`` table (see containers-registries.conf(5))."""

    prefix: str
    location: str
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = False
    mirrors: tuple[Mirror, ...] = ()

    def match_length(self, name: str) -> int:
        """Length of the matched prefix for ``name`` (``domain/path[:tag][@digest]``), or -1."""
        prefix = self.prefix
        if prefix.startswith("*."):
            host = name.split("/", 1)[0]
            host_only = host.rsplit(":", 1)[0] if not host.startswith("[") else host
            return len(host) if host_only.endswith(prefix[1:]) else -1
        if not name.startswith(prefix):
            return -1
        if len(name) == len(prefix) or name[len(prefix)] in "/:@":
            return len(prefix)
        return -1


@dataclass(frozen=True, slots=True)
class PullSource:
    """One place to try: the rewritten reference and whether it may use plain HTTP or
    unverified TLS. ``mirror`` is False for the primary location."""

    reference: Reference
    insecure: bool = False
    mirror: bool = False


def _bool(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise RegistriesConfigError(f"registries.conf: {where}.{key} must be true or false")
    return value


def _str(table: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise RegistriesConfigError(f"registries.conf: {where}.{key} must be a string")
    return value.strip().rstrip("/")


@dataclass(frozen=True, slots=True)
class RegistriesConfig:
    """Parsed registries.conf: the ``[[registry]]`` entries.

    Build with :meth:`from_toml`, :meth:`load` or directly; :meth:`with_insecure` adds an
    insecure host (the CLI's ``--insecure-registry``).
    """

    registries: tuple[RegistryEntry, ...] = field(default=())

    @classmethod
    def from_toml(cls, text: str) -> RegistriesConfig:
        """Parse a registries.conf v2 TOML document.

        Raises:
            RegistriesConfigError: invalid TOML, a v1 document (``[registries.search]``), or a
                field of the wrong type (names the field).
        """
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RegistriesConfigError(f"registries.conf is not valid TOML: {exc}") from exc
        if isinstance(doc.get("registries"), dict):
            raise RegistriesConfigError(
                "registries.conf uses the v1 format ([registries.*]); write [[registry]] tables"
            )
        tables = doc.get("registry", [])
        if not isinstance(tables, list):
            raise RegistriesConfigError("registries.conf: 'registry' must be an array of tables")
        entries = []
        for i, table in enumerate(tables):
            where = f"registry[{i}]"
            if not isinstance(table, dict):
                raise RegistriesConfigError(f"registries.conf: {where} is not a table")
            location = _str(table, "location", where)
            prefix = _str(table, "prefix", where) or location
            if not prefix:
                raise RegistriesConfigError(f"registries.conf: {where} needs location or prefix")
            if location.startswith(("http://", "https://")) or prefix.startswith(
                ("http://", "https://")
            ):
                raise RegistriesConfigError(
                    f"registries.conf: {where} location/prefix must not have a URL scheme"
                )
            mirrors = []
            raw_mirrors = table.get("mirror", [])
            if not isinstance(raw_mirrors, list):
                raise RegistriesConfigError(f"registries.conf: {where}.mirror must be an array")
            for j, m in enumerate(raw_mirrors):
                mwhere = f"{where}.mirror[{j}]"
                if not isinstance(m, dict):
                    raise RegistriesConfigError(f"registries.conf: {mwhere} is not a table")
                mloc = _str(m, "location", mwhere)
                if not mloc:
                    raise RegistriesConfigError(f"registries.conf: {mwhere} needs a location")
                pull_from = _str(m, "pull-from-mirror", mwhere, "all") or "all"
                if pull_from not in _PULL_FROM_MIRROR:
                    raise RegistriesConfigError(
                        f"registries.conf: {mwhere}.pull-from-mirror must be one of "
                        f"{', '.join(_PULL_FROM_MIRROR)}"
                    )
                mirrors.append(Mirror(mloc, _bool(m, "insecure", mwhere), pull_from))
            entries.append(
                RegistryEntry(
                    prefix=prefix,
                    location=location or prefix,
                    insecure=_bool(table, "insecure", where),
                    blocked=_bool(table, "blocked", where),
                    mirror_by_digest_only=_bool(table, "mirror-by-digest-only", where),
                    mirrors=tuple(mirrors),
                )
            )
        return cls(tuple(entries))

    @classmethod
    def load(cls, path: str | Path) -> RegistriesConfig:
        """Read and parse a registries.conf file (see :meth:`from_toml`); OSError if unreadable."""
        return cls.from_toml(Path(path).read_text(encoding="utf-8"))

    def with_insecure(self, host: str) -> RegistriesConfig:
        """Return a copy where ``host`` (``host[:port]``) may use plain HTTP / unverified TLS."""
        host = host.strip().rstrip("/")
        entries = list(self.registries)
        for i, entry in enumerate(entries):
            if entry.prefix == host:
                entries[i] = replace(entry, insecure=True)
                return RegistriesConfig(tuple(entries))
        entries.append(RegistryEntry(prefix=host, location=host, insecure=True))
        return RegistriesConfig(tuple(entries))

    def find(self, ref: Reference) -> RegistryEntry | None:
        """The entry with the longest prefix matching ``ref``, or ``None``."""
        name = str(ref)
        best: RegistryEntry | None = None
        best_len = -1
        for entry in self.registries:
            n = entry.match_length(name)
            if n > best_len:
                best, best_len = entry, n
        return best

    def is_insecure(self, host: str) -> bool:
        """True when a registry or mirror whose location host is ``host`` is marked insecure."""
        for entry in self.registries:
            if entry.insecure and entry.location.split("/", 1)[0] == host:
                return True
            for m in entry.mirrors:
                if m.insecure and m.location.split("/", 1)[0] == host:
                    return True
        return False

    def blocks_host(self, host: str) -> bool:
        """True when the entry that would apply to anything on ``host`` (``host[:port]``,
        a token realm's or redirect target's) is ``blocked``: the longest prefix matching
        ``host/`` (so ``evil.example``, ``evil.example:5000`` and ``*.example`` count; a
        prefix naming a repository path, ``evil.example/team``, does not block the host)."""
        name = f"{host.lower()}/"
        best: RegistryEntry | None = None
        best_len = -1
        for entry in self.registries:
            n = entry.match_length(name)
            if n > best_len:
                best, best_len = entry, n
        return best is not None and best.blocked

    def pull_sources(self, ref: Reference) -> list[PullSource]:
        """Where to fetch ``ref`` from: usable mirrors in order, then the primary location.

        Raises:
            Blocked: the matching registry entry is ``blocked``.
            InvalidReference: a rewritten location does not form a valid reference.
        """
        entry = self.find(ref)
        if entry is None:
            return [PullSource(ref)]
        if entry.blocked:
            raise Blocked(
                f"registry {entry.prefix} is blocked by registries.conf",
                registry=ref.domain,
                reference=str(ref),
            )
        name = str(ref)
        matched = entry.match_length(name)
        if entry.prefix.startswith("*."):
            # Wildcard prefixes only say which entries apply; they cannot rewrite locations.
            sources = [PullSource(ref, entry.insecure)]
            return self._mirrors(entry, ref, name, matched, wildcard=True) + sources
        primary = self._rewrite(entry.location, name, matched, ref)
        return [*self._mirrors(entry, ref, name, matched), PullSource(primary, entry.insecure)]

    def _mirrors(
        self, entry: RegistryEntry, ref: Reference, name: str, matched: int, wildcard: bool = False
    ) -> list[PullSource]:
        out = []
        for m in entry.mirrors:
            mode = m.pull_from_mirror
            if entry.mirror_by_digest_only and mode == "all":
                mode = "digest-only"
            if mode == "digest-only" and not ref.pinned:
                continue
            if mode == "tag-only" and ref.pinned:
                continue
            if wildcard:
                # Mirror the whole repository path under the mirror location.
                rewritten = self._rewrite(m.location, name, len(name.split("/", 1)[0]), ref)
            else:
                rewritten = self._rewrite(m.location, name, matched, ref)
            out.append(PullSource(rewritten, m.insecure, mirror=True))
        return out

    @staticmethod
    def _rewrite(location: str, name: str, matched: int, ref: Reference) -> Reference:
        new = location + name[matched:]
        try:
            out = parse_reference(new)
        except InvalidReference as exc:
            raise RegistriesConfigError(
                f"registries.conf rewrites {name} to invalid reference {new!r}: {exc.message}"
            ) from exc
        # Keep the original tag/digest: normalisation must not invent a tag for a digest ref.
        return Reference(out.domain, out.path, ref.tag, ref.digest)
