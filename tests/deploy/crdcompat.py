"""API compatibility rules between the CRDs of two releases, as pure functions over the CRD
objects (plain dicts as the YAML files hold them).

The rules (docs/design.md, "A CRD's name and scope never change in place"; Kubernetes' API
change guidelines, "On compatibility"): a CRD of the previous release keeps, under its name, its
group, scope, names (kind, plural, singular, listKind; short names may only be added), every
served version (still served) and its storage version (still defined and served: objects
stored in it must stay readable); in each version that both define, no property is removed,
no property changes its type and no field becomes required. Field removals and scope changes
go through a new version or a new CRD name. A CRD of the previous release that is gone is
accepted only when it is retired with a migration (:data:`rules.legacy.RETIRED_CRDS`,
which the controller acts on) and the CRD replacing it exists. A new CRD name is a new API,
but it may not take the group and plural or kind of a previous CRD that it does not replace.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from podplacement.rules.legacy import RetiredCRD


def _names(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    return (crd.get("spec") or {}).get("names") or {}


def _versions(crd: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(v.get("name")): v for v in (crd.get("spec") or {}).get("versions") or []}


def _storage(crd: Mapping[str, Any]) -> str | None:
    found = [name for name, v in _versions(crd).items() if v.get("storage")]
    return found[0] if len(found) == 1 else None


def _schema(version: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((version.get("schema") or {}).get("openAPIV3Schema")) or {}


def _children(schema: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path step, sub-schema) of each property, the items of an array and the values of a
    map (``additionalProperties``) of ``schema``."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f".{name}", sub
    if isinstance(schema.get("items"), Mapping):
        yield "[*]", schema["items"]
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield "{*}", schema["additionalProperties"]


def schema_changes(previous: Mapping[str, Any], current: Mapping[str, Any],
                   path: str = "") -> list[str]:
    """The incompatible changes from the OpenAPI v3 schema ``previous`` to ``current``:
    removed properties (or array items, map values), changed types, newly required fields;
    each as one line naming its path (``.spec.images{*}``)."""
    problems: list[str] = []
    if previous.get("type") != current.get("type"):
        problems.append(f"{path or '.'}: type {previous.get('type')!r} -> "
                        f"{current.get('type')!r}")
        return problems
    added = sorted(set(current.get("required") or []) - set(previous.get("required") or []))
    if added:
        problems.append(f"{path or '.'}: newly required {', '.join(added)}")
    now = dict(_children(current))
    for step, sub in _children(previous):
        if step not in now:
            problems.append(f"{path}{step}: removed")
            continue
        problems += schema_changes(sub, now[step], path + step)
    return problems


def crd_changes(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The incompatible changes from the previous release's CRD ``previous`` to the CRD of the
    same name ``current`` (module docstring), one line each; empty when compatible."""
    problems: list[str] = []
    p_spec, c_spec = previous.get("spec") or {}, current.get("spec") or {}
    for field in ("group", "scope"):
        if p_spec.get(field) != c_spec.get(field):
            problems.append(f"spec.{field}: {p_spec.get(field)!r} -> {c_spec.get(field)!r}")
    p_names, c_names = _names(previous), _names(current)
    for field in ("kind", "plural", "singular", "listKind"):
        if p_names.get(field) != c_names.get(field):
            problems.append(f"spec.names.{field}: {p_names.get(field)!r} -> "
                            f"{c_names.get(field)!r}")
    dropped = sorted(set(p_names.get("shortNames") or []) - set(c_names.get("shortNames") or []))
    if dropped:
        problems.append(f"spec.names.shortNames: removed {', '.join(dropped)}")
    p_versions, c_versions = _versions(previous), _versions(current)
    for name, version in p_versions.items():
        now = c_versions.get(name)
        if version.get("served") and not (now and now.get("served")):
            problems.append(f"version {name}: no longer served")
        if now is not None:
            problems += [f"version {name}: {line}"
                         for line in schema_changes(_schema(version), _schema(now))]
    storage = _storage(previous)
    if storage is not None and not (c_versions.get(storage) or {}).get("served"):
        problems.append(f"storage version {storage} of the previous release is not served "
                        "(objects stored in it would become unreadable)")
    if _storage(current) is None:
        problems.append("not exactly one storage version")
    return problems


def release_changes(previous: Iterable[Mapping[str, Any]], current: Iterable[Mapping[str, Any]],
                    retired: Sequence[RetiredCRD]) -> dict[str, list[str]]:
    """The incompatible changes from the previous release's CRDs to the current ones, by CRD
    name (only names with problems). A previous CRD that is gone must be in ``retired`` with
    its replacement present; a new CRD name may not take a previous CRD's group and plural or
    kind unless it replaces that CRD."""
    before = {str(c["metadata"]["name"]): c for c in previous}
    now = {str(c["metadata"]["name"]): c for c in current}
    by_name = {r.name: r for r in retired}
    problems: dict[str, list[str]] = {}
    for name, crd in before.items():
        if name in now:
            found = crd_changes(crd, now[name])
        elif name not in by_name:
            found = ["removed without a migration (rules.legacy.RETIRED_CRDS)"]
        elif by_name[name].replaced_by not in now:
            found = [f"retired, but its replacement {by_name[name].replaced_by} is missing"]
        else:
            found = _retired_changes(crd, by_name[name])
        if found:
            problems[name] = found
    for name, crd in now.items():
        if name in before:
            continue
        c_spec, c_names = crd.get("spec") or {}, _names(crd)
        replaces = {r.name for r in retired if r.replaced_by == name}
        for old_name, old in before.items():
            o_spec, o_names = old.get("spec") or {}, _names(old)
            if old_name in replaces or o_spec.get("group") != c_spec.get("group"):
                continue
            for field in ("plural", "kind"):
                if o_names.get(field) == c_names.get(field):
                    problems.setdefault(name, []).append(
                        f"a new name with the {field} {c_names.get(field)!r} of {old_name}")
    return problems


def _retired_changes(crd: Mapping[str, Any], retired: RetiredCRD) -> list[str]:
    """The retired record must describe the previous release's CRD, or the controller would
    look for leftovers that do not exist."""
    spec, names = crd.get("spec") or {}, _names(crd)
    seen = (spec.get("group"), names.get("plural"), names.get("kind"), spec.get("scope"))
    want = (retired.group, retired.plural, retired.kind, retired.scope)
    return [] if seen == want else [f"retired as {want}, but the previous release has {seen}"]
