"""PATCH bodies applied the way kube-apiserver applies them, with its error answers.

Four media types (``pods-patch-content-types.json``): JSON patch (RFC 6902), JSON merge patch
(RFC 7386), strategic merge patch (built-in types only, :mod:`localkube._smp`) and server-side
apply (``application/apply-patch+yaml``, approximated as a strategic merge of the applied
configuration without managedFields bookkeeping). Failures are :class:`StatusError` with the
bodies the real server sends: a malformed body is ``400 error decoding patch: <Go error>``, a
JSON patch that does not apply (failed ``test``, missing path, bad index, unknown op) is the
generic ``422`` with empty details (``optimistic-concurrency.json``), an unsupported media type
is ``415``. Pure: no I/O.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import yaml

import localkube._gojson as _gojson
from localkube._smp import MERGE_LISTS, SMPError, strategic_merge
from localkube.errors import StatusError, bad_request, patch_apply_failed

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# The real server applies at most this many JSON patch operations (apiserver handlers/patch.go).
MAX_JSON_PATCH_OPERATIONS = 10000


class JSONPatchError(ValueError):
    """One RFC 6902 operation that cannot be applied (the reason is for logs only)."""


def unsupported_media_type(strategic: bool) -> StatusError:
    """The 415 for a Content-Type the PATCH verb does not take.

    Built-in types answer ``415: Unsupported Media Type`` (``pods-patch-content-types.json``);
    custom resources list what they accept (``errors.json``).
    """
    if strategic:
        return StatusError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
    return StatusError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}",
    )


def apply_patch(
    content_type: str,
    obj: dict[str, Any],
    body: bytes,
    *,
    strategic: bool,
    field_manager: str | None = None,
) -> dict[str, Any]:
    """Return a patched copy of ``obj`` (``obj`` itself is not modified).

    Args:
        content_type: the media type without parameters, one of ``application/json-patch+json``,
            ``application/merge-patch+json``, ``application/strategic-merge-patch+json``,
            ``application/apply-patch+yaml``.
        obj: the current object as the JSON API shows it.
        body: the raw request body.
        strategic: True for built-in types with strategic-merge metadata (pods, nodes, ...);
            False for custom resources, which reject strategic merge patch with 415.
        field_manager: the ``?fieldManager=`` of an apply patch; when given, the manager's
            ``managedFields`` entry is kept and fields it stopped applying are removed
            (see :func:`apply_configuration`). Ignored by the other patch types.

    Returns:
        the patched object (a new dict).

    Raises:
        StatusError: 400 for a body that does not decode, 422 (generic message, empty details)
            for a JSON patch that does not apply, 415 for other media types.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON_PATCH:
        return apply_json_patch(obj, _decode(body))
    if media == MERGE_PATCH:
        patch = _decode(body)
        if not isinstance(patch, dict):
            raise _cannot_unmarshal(patch, "map[string]interface {}")
        # Deep copy first: the result must share nothing with the stored object.
        merged: dict[str, Any] = merge_patch(_gojson.clone(obj), patch)
        return merged
    if media == STRATEGIC_MERGE_PATCH:
        if not strategic:
            raise unsupported_media_type(False)
        patch = _decode(body)
        if not isinstance(patch, dict):
            raise _cannot_unmarshal(patch, "map[string]interface {}")
        try:
            return strategic_merge(_gojson.clone(obj), patch)
        except SMPError as exc:
            raise bad_request(str(exc)) from exc
    if media == APPLY_PATCH:
        return apply_configuration(
            obj, _decode_yaml(body), strategic=strategic, field_manager=field_manager
        )
    raise unsupported_media_type(strategic)


def _decode(body: bytes) -> Any:
    try:
        return _gojson.loads(body)
    except _gojson.GoJSONError as exc:
        raise bad_request(f"error decoding patch: {exc}") from exc


def _cannot_unmarshal(value: Any, go_type: str) -> StatusError:
    kind = _gojson.go_type_name(value)
    return bad_request(
        f"error decoding patch: json: cannot unmarshal {kind} into Go value of type {go_type}"
    )


def _decode_yaml(body: bytes) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise bad_request(f"error decoding YAML: {exc}") from exc
    if not isinstance(doc, dict):
        kind = _gojson.go_type_name(doc)
        raise bad_request(
            f"error decoding YAML: json: cannot unmarshal {kind} into Go value of type "
            "map[string]interface {}"
        )
    return doc


# --- RFC 6902 -----------------------------------------------------------------------------


def apply_json_patch(obj: dict[str, Any], operations: Any) -> dict[str, Any]:
    """Apply an RFC 6902 JSON patch (already decoded) to a copy of ``obj``.

    Raises:
        StatusError: 400 when ``operations`` is not a list of objects (Go's decode error into
            ``[]handlers.jsonPatchOp``); the generic 422 when an operation fails.
    """
    if operations is None:
        copied: dict[str, Any] = _gojson.clone(obj)
        return copied
    if not isinstance(operations, list):
        raise _cannot_unmarshal(operations, "[]handlers.jsonPatchOp")
    for op in operations:
        if not isinstance(op, dict):
            raise _cannot_unmarshal(op, "handlers.jsonPatchOp")
    if len(operations) > MAX_JSON_PATCH_OPERATIONS:
        raise StatusError(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: The allowed maximum operations in a JSON patch is "
            f"{MAX_JSON_PATCH_OPERATIONS}, got {len(operations)}",
        )
    try:
        doc = run_json_patch(obj, operations)
    except JSONPatchError as exc:
        raise patch_apply_failed() from exc
    if not isinstance(doc, dict):
        raise patch_apply_failed()
    return doc


def run_json_patch(doc: Any, operations: list[dict[str, Any]]) -> Any:
    """Apply decoded RFC 6902 operations to a copy of ``doc`` and return the result.

    Raises:
        JSONPatchError: an operation does not apply; the message is worded like
            ``github.com/evanphx/json-patch`` (``Unexpected kind: frobnicate``,
            ``replace operation does not apply: doc is missing path: /x: missing value``).
    """
    result: Any = _gojson.clone(doc)
    for op in operations:
        if not isinstance(op, dict):
            raise JSONPatchError("Unexpected kind: unknown")
        result = _apply_operation(result, op)
    return result


def parse_pointer(pointer: str) -> list[str]:
    """Split an RFC 6901 JSON pointer into unescaped tokens (``~1`` → ``/``, ``~0`` → ``~``).

    Raises:
        JSONPatchError: the pointer is not empty and does not start with ``/``.
    """
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JSONPatchError(f"invalid JSON pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


_MISSING = ": missing value"
_INVALID_INDEX = "invalid index referenced"


def _index(token: str, size: int, *, allow_end: bool) -> int | None:
    """The list index a token names, or None when it is not a valid index for the operation."""
    if token == "-":
        return size if allow_end else None
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        return None
    index = int(token)
    limit = size if allow_end else size - 1
    return index if index <= limit else None


def _find_container(doc: Any, tokens: list[str]) -> Any:
    """The object or list holding the last token (evanphx ``findObject``), or None."""
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                return None
            node = node[token]
        elif isinstance(node, list):
            index = _index(token, len(node), allow_end=False)
            if index is None:
                return None
            node = node[index]
        else:
            return None
    return node if isinstance(node, dict | list) else None


def _bad_index(kind: str, path: str, token: str) -> JSONPatchError:
    return JSONPatchError(
        f"error in {kind} for path: '{path}': "
        f"Unable to access invalid index: {token}: {_INVALID_INDEX}"
    )


def _get(doc: Any, tokens: list[str], path: str, kind: str) -> Any:
    if not tokens:
        return doc
    con = _find_container(doc, tokens)
    if con is None:
        raise JSONPatchError(
            f"{kind} operation does not apply: doc is missing path: {path}{_MISSING}"
        )
    last = tokens[-1]
    if isinstance(con, dict):
        if last not in con:
            raise JSONPatchError(
                f"{kind} operation does not apply: doc is missing key: {path}{_MISSING}"
            )
        return con[last]
    index = _index(last, len(con), allow_end=False)
    if index is None:
        raise _bad_index(kind, path, last)
    return con[index]


def _add(doc: Any, tokens: list[str], value: Any, path: str) -> Any:
    if not tokens:
        return value
    con = _find_container(doc, tokens)
    if con is None:
        raise JSONPatchError(
            f'add operation does not apply: doc is missing path: "{path}"{_MISSING}'
        )
    last = tokens[-1]
    if isinstance(con, dict):
        con[last] = value
        return doc
    index = _index(last, len(con), allow_end=True)
    if index is None:
        raise _bad_index("add", path, last)
    con.insert(index, value)
    return doc


def _remove(doc: Any, tokens: list[str], path: str, kind: str = "remove") -> tuple[Any, Any]:
    con = _find_container(doc, tokens) if tokens else None
    if con is None:
        raise JSONPatchError(
            f'{kind} operation does not apply: doc is missing path: "{path}"{_MISSING}'
        )
    last = tokens[-1]
    if isinstance(con, dict):
        if last not in con:
            raise JSONPatchError(
                f"error in {kind} for path: '{path}': "
                f"Unable to remove nonexistent key: {last}{_MISSING}"
            )
        return doc, con.pop(last)
    index = _index(last, len(con), allow_end=False)
    if index is None:
        raise _bad_index(kind, path, last)
    return doc, con.pop(index)


def _json_equal(a: Any, b: Any) -> bool:
    """RFC 6902 ``test`` equality: types matter (``1`` is not ``true``), numbers by value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _apply_operation(doc: Any, op: dict[str, Any]) -> Any:
    """One operation; errors are worded like github.com/evanphx/json-patch, which the
    apiserver embeds in its 500 for a webhook patch that does not apply."""
    kind = op.get("op")
    if kind not in ("add", "remove", "replace", "move", "copy", "test"):
        raise JSONPatchError(f"Unexpected kind: {kind if isinstance(kind, str) else 'unknown'}")
    path = op.get("path")
    if not isinstance(path, str):
        raise JSONPatchError(f"{kind} operation failed to decode path{_MISSING}")
    tokens = parse_pointer(path)
    if kind == "add":
        if "value" not in op:
            raise JSONPatchError(f"add operation failed to decode value{_MISSING}")
        return _add(doc, tokens, _gojson.clone(op["value"]), path)
    if kind == "remove":
        return _remove(doc, tokens, path)[0]
    if kind == "replace":
        if "value" not in op:
            raise JSONPatchError(f"replace operation failed to decode value{_MISSING}")
        if not tokens:
            return _gojson.clone(op["value"])
        _get(doc, tokens, path, "replace")
        con = _find_container(doc, tokens)
        if isinstance(con, dict):
            con[tokens[-1]] = _gojson.clone(op["value"])
        elif isinstance(con, list):
            con[int(tokens[-1])] = _gojson.clone(op["value"])
        return doc
    if kind in ("move", "copy"):
        source = op.get("from")
        if not isinstance(source, str):
            raise JSONPatchError(f"{kind} operation failed to decode from{_MISSING}")
        from_tokens = parse_pointer(source)
        if kind == "move":
            if tokens[: len(from_tokens)] == from_tokens and len(tokens) > len(from_tokens):
                raise JSONPatchError(
                    f"move operation does not apply: cannot move into itself: {path}"
                )
            doc, value = _remove(doc, from_tokens, source, "move")
        else:
            value = _gojson.clone(_get(doc, from_tokens, source, "copy"))
        return _add(doc, tokens, value, path)
    if "value" not in op:
        raise JSONPatchError(f"test operation failed to decode value{_MISSING}")
    con = _find_container(doc, tokens) if tokens else doc
    if con is None:
        raise JSONPatchError(f"test operation does not apply: is missing path: {path}{_MISSING}")
    try:
        current = _get(doc, tokens, path, "test")
    except JSONPatchError:
        current = None
    if not _json_equal(current, op["value"]):
        raise JSONPatchError(f"testing value {path} failed: test failed")
    return doc


# --- RFC 7386 -----------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, all else replaces.

    Returns a new value; neither argument is modified.
    """
    if not isinstance(patch, dict):
        return _gojson.clone(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- server-side apply (approximation) ----------------------------------------------------


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


# Fields server-side apply never records as owned.
_UNOWNED_TOP = frozenset({"apiVersion", "kind"})
_UNOWNED_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    }
)

FieldPath = tuple[str, ...]


def _item_token(item: Any, key: str) -> str:
    return "k:" + json.dumps({key: item.get(key)}, separators=(",", ":"))


def owned_fields(config: dict[str, Any], *, strategic: bool) -> set[FieldPath]:
    """The field paths an applied configuration sets, as ``fieldsV1`` tokens.

    Maps give ``f:<key>``; items of keyed lists (built-in types, by their strategic merge key)
    give ``k:{"<key>":<value>}`` and are owned themselves; every other list is atomic (a leaf).
    """
    out: set[FieldPath] = set()

    def walk(value: Any, path: FieldPath, field: str) -> None:
        if isinstance(value, dict):
            # An empty map owns nothing: owning the map itself would let a later apply that
            # omits it delete everything other writers put there.
            for key, sub in value.items():
                if not path and key in _UNOWNED_TOP:
                    continue
                if path == ("f:metadata",) and key in _UNOWNED_META:
                    continue
                walk(sub, (*path, f"f:{key}"), key)
            return
        strategy = MERGE_LISTS.get(field) if strategic else None
        if isinstance(value, list) and strategy is not None and strategy.merge_key:
            key = strategy.merge_key
            if all(isinstance(item, dict) and key in item for item in value):
                for item in value:
                    item_path = (*path, _item_token(item, key))
                    out.add(item_path)
                    walk({k: v for k, v in item.items() if k != key}, item_path, "")
                    out.add((*item_path, f"f:{key}"))
                return
        if path:
            out.add(path)

    walk(config, (), "")
    return out


def _fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for token in path:
            node = node.setdefault(token, {})
        if path[-1].startswith("k:"):
            node.setdefault(".", {})
    return tree


def _paths_of(tree: dict[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    out: set[FieldPath] = set()
    for token, sub in tree.items():
        if token == ".":
            continue
        path = (*prefix, token)
        if not sub or "." in sub or token.startswith("k:"):
            out.add(path)
        if isinstance(sub, dict):
            out |= _paths_of(sub, path)
    return out


def _remove_path(obj: dict[str, Any], path: FieldPath) -> None:
    node: Any = obj
    for depth, token in enumerate(path):
        last = depth == len(path) - 1
        if token.startswith("f:") and isinstance(node, dict):
            key = token[2:]
            if key not in node:
                return
            if last:
                del node[key]
                return
            node = node[key]
        elif token.startswith("k:") and isinstance(node, list):
            wanted = json.loads(token[2:])
            index = next(
                (
                    i
                    for i, item in enumerate(node)
                    if isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items())
                ),
                None,
            )
            if index is None:
                return
            if last:
                del node[index]
                return
            node = node[index]
        else:
            return


def apply_configuration(
    live: dict[str, Any],
    applied: dict[str, Any],
    *,
    strategic: bool,
    field_manager: str | None = None,
) -> dict[str, Any]:
    """Merge a server-side-apply configuration into the live object.

    Approximation of structured-merge-diff: maps merge, lists keyed by the strategic merge
    keys merge by key (built-in types), other lists are replaced, and ``null`` means "no
    opinion". With ``field_manager``, the manager's ``Apply`` entry in
    ``metadata.managedFields`` records the fields it set (``fieldsV1``), and fields it set last
    time but omits now are removed (``pods-patch-content-types.json``: re-applying without a
    label removes it). Ownership by other managers is not tracked (no conflicts).

    Raises:
        StatusError: 400 for an item of a keyed list without its key.
    """
    config = _drop_nulls(applied)
    base = _gojson.clone(live)
    owned = owned_fields(config, strategic=strategic) if field_manager else set()
    entries = list((base.get("metadata") or {}).get("managedFields") or [])
    if field_manager:
        previous = next(
            (
                e
                for e in entries
                if isinstance(e, dict)
                and e.get("manager") == field_manager
                and e.get("operation") == "Apply"
            ),
            None,
        )
        if previous is not None:
            dropped = _paths_of(previous.get("fieldsV1") or {}) - owned
            for path in sorted(dropped, key=len):
                _remove_path(base, path)
    if strategic:
        try:
            merged = strategic_merge(base, config)
        except SMPError as exc:
            raise bad_request(str(exc)) from exc
    else:
        merged = merge_patch(base, config)
    if field_manager:
        entry = {
            "manager": field_manager,
            "operation": "Apply",
            "apiVersion": config.get("apiVersion") or live.get("apiVersion", ""),
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(owned),
        }
        kept = [
            e
            for e in entries
            if not (
                isinstance(e, dict)
                and e.get("manager") == field_manager
                and e.get("operation") == "Apply"
            )
        ]
        merged.setdefault("metadata", {})["managedFields"] = [*kept, entry]
    return merged
