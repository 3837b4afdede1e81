"""Render the field reference of each CRD in ``deploy/crds/`` as a Markdown page of the docs
site, ``docs/reference/<kind, lower case>.md``, so the reference cannot drift from the schema
the API server enforces.

A page lists every field of the CRD's storage version's ``openAPIV3Schema`` (``apiVersion``,
``kind`` and ``metadata`` left out), depth first in the schema's order: its path (``[]`` for
the items of a list, ``{}`` for the values of a map), its type, its default, its constraints
(``required``, ``enum``, bounds, ``pattern``, list and map types, CEL rules with their
messages) and its ``description``. The object's own CEL rules, the printer columns and the
names come first.

Usage (from the repository root)::

    python hack/crdref.py           # write the pages
    python hack/crdref.py --check   # exit 1, naming each stale page, if a page differs

``tests/test_docs.py`` runs the check, so a CRD changed without regenerating its page fails
the suite. A CRD that cannot be read is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "deploy" / "crds"
OUT_DIR = REPO / "docs" / "reference"

#: The hand-written page with the prose of each kind, linked from its generated page
#: (relative to docs/reference/).
GUIDES = {
    "PodPlacementConfig": ("../guide/configuration.md", "Configuration"),
    "PodPlacementPolicy": ("../guide/policies.md", "Per-namespace placement policies"),
    "ImagePlatformCatalog": ("../how-it-decides.md#the-webhook-which-pods-get-the-gate",
                             "How it decides: placement inside the API server"),
}
_SCOPES = {"Cluster": "cluster-scoped", "Namespaced": "namespaced"}
#: Characters Markdown would read inside an HTML ``<code>`` element (its text is still
#: Markdown), as entities.
_ENTITIES = {c: f"&#{ord(c)};" for c in "\\`*_[]|"}
#: Top-level properties every object has; the reference leaves them out.
_STANDARD = ("apiVersion", "kind", "metadata")


class CRDError(Exception):
    """A CRD file that is not a CustomResourceDefinition this script can render (the message
    names the file and what is missing)."""


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: whitespace folded, ``|`` and ``<`` escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _code(value: Any) -> str:
    """A JSON value as inline code (strings unquoted), safe inside a table cell: a text with
    ``|`` (or a backtick) becomes an HTML ``<code>`` element with the pipe as ``&#124;``, since
    a pipe splits a table row even inside backticks on GitHub, while MkDocs' Markdown shows a
    backslash-escaped one literally; the element's text is still Markdown, so the characters
    Markdown reads are entities too."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    if "|" not in text and "`" not in text:
        return f"`{text}`"
    escaped = "".join(_ENTITIES.get(c, c) for c in html.escape(text, quote=False))
    return f"<code>{escaped}</code>"


def _type(schema: Mapping[str, Any]) -> str:
    """The type column: ``string``, ``integer (int32)``, ``list of object``, ``map of string``,
    ``string (date-time)``, or ``any`` without a type."""
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return "list of " + _type(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return "map of " + _type(schema["additionalProperties"])
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else kind


def _bounds(schema: Mapping[str, Any], low: str, high: str, unit: str) -> str | None:
    lo, hi = schema.get(low), schema.get(high)
    if lo is not None and hi is not None:
        return f"{lo}..{hi}{unit}"
    if lo is not None:
        return f"at least {lo}{unit}"
    if hi is not None:
        return f"at most {hi}{unit}"
    return None


def _constraints(schema: Mapping[str, Any], required: bool) -> list[str]:
    """The constraints of one field, each a short Markdown phrase."""
    out: list[str] = []
    if required:
        out.append("required")
    if "enum" in schema:
        out.append("one of " + ", ".join(_code(v) for v in schema["enum"]))
    for low, high, unit in (("minimum", "maximum", ""), ("minLength", "maxLength", " characters"),
                            ("minItems", "maxItems", " items"),
                            ("minProperties", "maxProperties", " entries")):
        text = _bounds(schema, low, high, unit)
        if text:
            out.append(text)
    if "pattern" in schema:
        out.append("pattern " + _code(schema["pattern"]))
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        out.append("a set: no duplicates")
    elif list_type == "map":
        keys = ", ".join(_code(k) for k in schema.get("x-kubernetes-list-map-keys", []))
        out.append(f"a map list keyed by {keys}: one item per key")
    elif list_type == "atomic":
        out.append("atomic list")
    if schema.get("x-kubernetes-map-type") == "atomic":
        out.append("atomic")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        out.append("unknown fields kept")
    for rule in schema.get("x-kubernetes-validations", []):
        text = "rule " + _code(rule["rule"])
        if rule.get("message"):
            text += ": " + _cell(str(rule["message"]))
        out.append(text)
    # a list's scalar items and a map's scalar values have no row of their own
    for key, what in (("items", "each item"), ("additionalProperties", "each value")):
        inner = schema.get(key)
        if isinstance(inner, Mapping) and not (inner.get("properties") or inner.get("items")):
            out += [f"{what}: {c}" for c in _constraints(inner, False)]
    return out


def _fields(schema: Mapping[str, Any], path: str, required: bool, emit: bool = True,
            root: bool = False) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    """(path, schema, required) of ``schema`` (unless ``emit`` is false) and of every field
    below it, depth first; at the ``root`` the standard fields are left out."""
    if emit:
        yield path, schema, required
    needed = set(schema.get("required", []))
    for name, child in schema.get("properties", {}).items():
        if root and name in _STANDARD:
            continue
        yield from _fields(child, f"{path}.{name}" if path else name, name in needed)
    items = schema.get("items")
    if isinstance(items, Mapping) and (items.get("properties") or items.get("items")):
        yield from _fields(items, f"{path}[]", False, emit=False)
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping) and (values.get("properties") or values.get("items")):
        yield from _fields(values, f"{path}{{}}", False, emit=False)


def _version(crd: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    try:
        versions = crd["spec"]["versions"]
        (version,) = [v for v in versions if v.get("storage")]
        schema = version["schema"]["openAPIV3Schema"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CRDError(f"{source}: no single storage version with a schema ({exc!r})") from exc
    if not isinstance(schema, Mapping):
        raise CRDError(f"{source}: openAPIV3Schema is not an object")
    result: Mapping[str, Any] = version
    return result


def render(crd: Mapping[str, Any], source: str) -> str:
    """The Markdown page of one CRD (a dict as ``yaml.safe_load`` reads it); ``source`` is the
    file's path relative to the repository root, named in the page.

    Raises:
        CRDError: not a CustomResourceDefinition with one storage version and a schema.
    """
    if crd.get("kind") != "CustomResourceDefinition":
        raise CRDError(f"{source}: not a CustomResourceDefinition")
    version = _version(crd, source)
    schema = version["schema"]["openAPIV3Schema"]
    spec, names = crd["spec"], crd["spec"]["names"]
    kind = names["kind"]
    scope = _SCOPES.get(spec["scope"], spec["scope"])
    lines = [
        f"# {kind}",
        "",
        f"<!-- Generated by hack/crdref.py from {source}: do not edit. After changing the CRD,"
        " run `python hack/crdref.py`. -->",
        "",
        f"`{spec['group']}/{version['name']}`, kind `{kind}`, {scope};"
        f" CRD `{crd['metadata']['name']}`, plural `{names['plural']}`"
        + (", short names " + ", ".join(f"`{n}`" for n in names["shortNames"])
           if names.get("shortNames") else "")
        + f". Generated from `{source}`: the schema the API server enforces.",
        "",
    ]
    if schema.get("description"):
        lines += [" ".join(str(schema["description"]).split()), ""]
    guide = GUIDES.get(kind)
    if guide:
        lines += [f"What each field does, with examples: [{guide[1]}]({guide[0]}).", ""]
    rules = schema.get("x-kubernetes-validations", [])
    if rules:
        lines += ["Rules on the whole object:", ""]
        lines += [f"- {_code(r['rule'])}: {_cell(str(r.get('message', '')))}" for r in rules]
        lines.append("")
    columns = version.get("additionalPrinterColumns", [])
    if columns:
        lines += ["`kubectl get` columns:", "", "| column | type | from | shown |",
                  "|---|---|---|---|"]
        for c in columns:
            shown = "with `-o wide`" if c.get("priority", 0) > 0 else "always"
            lines.append(f"| {c['name']} | {c['type']} | {_code(c['jsonPath'])} | {shown} |")
        lines.append("")
    if version.get("subresources"):
        lines += ["Subresources: " + ", ".join(f"`{s}`" for s in version["subresources"]) + ".",
                  ""]
    lines += ["## Fields", "", "| field | type | default | constraints | description |",
              "|---|---|---|---|---|"]
    for path, field, required in _fields(schema, "", False, emit=False, root=True):
        default = _code(field["default"]) if "default" in field else ""
        constraints = "; ".join(_constraints(field, required))
        description = _cell(str(field.get("description", "")))
        lines.append(f"| `{path}` | {_type(field)} | {default} | {constraints} | {description} |")
    return "\n".join(lines) + "\n"


def field_paths(crd: Mapping[str, Any]) -> list[str]:
    """The field paths of a CRD's page, in its order (``spec.topology.enabled``,
    ``spec.plugins.nodeAffinityScoring.platforms[].weight``, ...)."""
    schema = _version(crd, "CRD")["schema"]["openAPIV3Schema"]
    return [path for path, _, _ in _fields(schema, "", False, emit=False, root=True)]


def pages(crd_dir: Path = CRD_DIR) -> dict[str, str]:
    """File name under docs/reference/ → its generated text, one per CRD file of ``crd_dir``.

    Raises:
        CRDError: a file that does not parse or is not a renderable CRD.
    """
    out: dict[str, str] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        source = f"deploy/crds/{path.name}"  # as the page names it, wherever crd_dir is
        try:
            crd = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise CRDError(f"{source}: {' '.join(str(exc).split())}") from exc
        if not isinstance(crd, Mapping):
            raise CRDError(f"{source}: not a YAML mapping")
        try:
            out[f"{crd['spec']['names']['kind'].lower()}.md"] = render(crd, source)
        except (KeyError, TypeError, AttributeError) as exc:
            raise CRDError(f"{source}: not a CRD this script can render ({exc!r})") from exc
    return out


def stale(out_dir: Path = OUT_DIR, crd_dir: Path = CRD_DIR) -> list[str]:
    """The pages under ``out_dir`` that differ from what the CRDs generate (missing ones
    included), by file name."""
    return [name for name, text in pages(crd_dir).items()
            if not (out_dir / name).is_file() or (out_dir / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the pages; 0 when done or current, 1 when stale,
    2 when a CRD cannot be read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare instead of writing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            names = stale()
            for name in names:
                print(f"crdref: docs/reference/{name} is stale: run python hack/crdref.py",
                      file=sys.stderr)
            return 1 if names else 0
        for name, text in pages().items():
            (OUT_DIR / name).write_text(text)
    except CRDError as exc:
        print(f"crdref: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
