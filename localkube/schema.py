"""Structural OpenAPI v3 schema handling for custom resources: pruning, defaulting, validation.

Covers what CRDs in this project use and the reference recordings show
(``crd-podplacementconfig.json``, ``crd-noderesourcetopology.json``): ``type`` (with
``x-kubernetes-int-or-string`` and ``nullable``), ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``pattern``, ``minItems``/``maxItems``, ``required``,
``x-kubernetes-list-type: map`` duplicate keys, ``default``, pruning of unknown fields
(``x-kubernetes-preserve-unknown-fields`` respected), and ``x-kubernetes-validations`` rules of
the simple form ``self.<path> == '<literal>'``. Cause reasons and messages follow
apiextensions-apiserver (kube-openapi validate + field.Error formatting). Pure code.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

Cause = dict[str, str]

_TYPE_ORDER = {"FieldValueTypeInvalid": 0, "FieldValueInvalid": 0, "FieldValueTooMany": 0,
               "FieldValueTooLong": 0, "FieldValueNotSupported": 1, "FieldValueRequired": 2}
_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                       "FieldValueTooMany", "FieldValueTypeInvalid"})
_CEL_RE = re.compile(r"^\s*self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*==\s*'([^']*)'\s*$")
_PATTERN_CACHE: dict[str, re.Pattern[str]] = {}


def _go_value(v: Any) -> str:
    """Format a value as field.Invalid does (``%q`` strings, ``null``, JSON for objects)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return orjson.dumps(v).decode()
    if isinstance(v, int | float):
        return str(v)
    return orjson.dumps(v).decode()


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _type_ok(schema: dict[str, Any], v: Any) -> bool:
    t = schema.get("type")
    if v is None:
        return bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(v, int | str) and not isinstance(v, bool)
    if not t:
        return True
    actual = _json_type(v)
    if t == "number":
        return actual in ("number", "integer")
    if t == "integer" and isinstance(v, float) and v.is_integer():
        return True
    return bool(actual == t)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(obj: dict[str, Any], schema: dict[str, Any]) -> list[Cause]:
    """Validate a custom resource against its ``openAPIV3Schema``.

    Returns:
        the causes (``{"reason", "message", "field"}``) in the order the real server reports
        them: value errors, then unsupported enum values, then missing required fields, then
        list-map duplicates; when a blocking error exists (unsupported value, required, too
        long, too many, wrong type) and the schema has CEL rules, the ``some validation rules
        were not checked`` cause is appended instead of running CEL (apiextensions-apiserver
        ``hasBlockingErr``); otherwise the CEL rule failures follow.
    """
    causes: list[Cause] = []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    props = dict(schema.get("properties") or {})
    for k in ("apiVersion", "kind", "metadata"):
        props.pop(k, None)
    root = dict(schema)
    root["properties"] = props
    root["required"] = [r for r in schema.get("required") or [] if r not in ("metadata",)]
    _validate(body, root, "", causes)
    causes.sort(key=lambda c: _TYPE_ORDER.get(c["reason"], 0))
    _duplicates(body, root, "", causes)
    # apiextensions-apiserver skips the CEL rules when a "blocking" schema error exists
    # (unsupported value, required, too long, too many, wrong type) and says so instead.
    blocking = any(c["reason"] in _BLOCKING for c in causes)
    if blocking:
        if _has_cel(schema):
            causes.append({
                "reason": "FieldValueInvalid",
                "message": "Invalid value: null: some validation rules were not checked because"
                " the object was invalid; correct the existing errors to complete validation",
                "field": "<nil>",
            })
        return causes
    causes.extend(_run_cel(obj, schema, ""))
    return causes


def _validate(v: Any, schema: dict[str, Any], path: str, out: list[Cause]) -> None:
    where = path or "<nil>"
    if not _type_ok(schema, v):
        t = schema.get("type", "")
        out.append({
            "reason": "FieldValueTypeInvalid",
            "message": f"Invalid value: {_go_value(_json_type(v))}: {path} in body must be of"
            f" type {t}: {_go_value(_json_type(v))}",
            "field": where,
        })
        return
    if v is None:
        return
    if isinstance(v, int | float) and not isinstance(v, bool):
        if "minimum" in schema and v < schema["minimum"]:
            out.append({"reason": "FieldValueInvalid",
                        "message": f"Invalid value: {_go_value(v)}: {path} in body should be"
                        f" greater than or equal to {schema['minimum']}", "field": where})
        if "maximum" in schema and v > schema["maximum"]:
            out.append({"reason": "FieldValueInvalid",
                        "message": f"Invalid value: {_go_value(v)}: {path} in body should be"
                        f" less than or equal to {schema['maximum']}", "field": where})
    if isinstance(v, str):
        if "maxLength" in schema and len(v) > schema["maxLength"]:
            out.append({"reason": "FieldValueTooLong",
                        "message": f"Too long: may not be more than {schema['maxLength']} bytes",
                        "field": where})
        if "minLength" in schema and len(v) < schema["minLength"]:
            out.append({"reason": "FieldValueInvalid",
                        "message": f"Invalid value: {_go_value(v)}: {path} in body should be at"
                        f" least {schema['minLength']} chars long", "field": where})
        pat = schema.get("pattern")
        if pat:
            rx = _PATTERN_CACHE.get(pat)
            if rx is None:
                rx = _PATTERN_CACHE[pat] = re.compile(pat)
            if not rx.search(v):
                out.append({"reason": "FieldValueInvalid",
                            "message": f"Invalid value: {_go_value(v)}: {path} in body should"
                            f" match '{pat}'", "field": where})
    enum = schema.get("enum")
    if enum is not None and v not in enum:
        supported = ", ".join(_go_value(e) for e in enum)
        out.append({"reason": "FieldValueNotSupported",
                    "message": f"Unsupported value: {_go_value(v)}: supported values: {supported}",
                    "field": where})
    if isinstance(v, list):
        if "maxItems" in schema and len(v) > schema["maxItems"]:
            out.append({"reason": "FieldValueTooMany",
                        "message": f"Too many: {len(v)}: must have at most {schema['maxItems']}"
                        " items", "field": where})
        if "minItems" in schema and len(v) < schema["minItems"]:
            out.append({"reason": "FieldValueInvalid",
                        "message": f"Invalid value: {len(v)}: {path} in body should have at"
                        f" least {schema['minItems']} items", "field": where})
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(v):
                _validate(item, items, f"{path}[{i}]", out)
    elif isinstance(v, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in v:
                out.append({"reason": "FieldValueRequired", "message": "Required value",
                            "field": _join(path, key)})
        addl = schema.get("additionalProperties")
        for key, sub in v.items():
            if key in props:
                _validate(sub, props[key], _join(path, key), out)
            elif isinstance(addl, dict):
                _validate(sub, addl, _join(path, key), out)


def _duplicates(v: Any, schema: dict[str, Any], path: str, out: list[Cause]) -> None:
    if isinstance(v, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen: set[bytes] = set()
            for i, item in enumerate(v):
                if not isinstance(item, dict):
                    continue
                k = orjson.dumps({kk: item.get(kk) for kk in keys if kk in item})
                if k in seen:
                    out.append({"reason": "FieldValueDuplicate",
                                "message": f"Duplicate value: {k.decode()}",
                                "field": f"{path}[{i}]"})
                seen.add(k)
        elif schema.get("x-kubernetes-list-type") == "set":
            seen_s: set[bytes] = set()
            for i, item in enumerate(v):
                k = orjson.dumps(item)
                if k in seen_s:
                    out.append({"reason": "FieldValueDuplicate",
                                "message": f"Duplicate value: {k.decode()}",
                                "field": f"{path}[{i}]"})
                seen_s.add(k)
        if items:
            for i, item in enumerate(v):
                _duplicates(item, items, f"{path}[{i}]", out)
    elif isinstance(v, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        for key, sub in v.items():
            if key in props:
                _duplicates(sub, props[key], _join(path, key), out)
            elif isinstance(addl, dict):
                _duplicates(sub, addl, _join(path, key), out)


def _has_cel(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    if schema.get("x-kubernetes-validations"):
        return True
    for key in ("properties",):
        for sub in (schema.get(key) or {}).values():
            if _has_cel(sub):
                return True
    return _has_cel(schema.get("items")) or _has_cel(schema.get("additionalProperties"))


def _run_cel(v: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if not _eval_rule(rule.get("rule", ""), v):
            msg = rule.get("message") or f"failed rule: {rule.get('rule', '')}"
            field = path or "<nil>"
            if rule.get("fieldPath"):
                field = _join(path, rule["fieldPath"].lstrip("."))
            reason = rule.get("reason", "FieldValueInvalid")
            out.append({"reason": reason,
                        "message": f"Invalid value: {msg}" if reason == "FieldValueInvalid"
                        else msg,
                        "field": field})
    if isinstance(v, dict):
        props = schema.get("properties") or {}
        for key, sub in v.items():
            if key in props and key != "metadata":
                out.extend(_run_cel(sub, props[key], _join(path, key)))
    elif isinstance(v, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(v):
            out.extend(_run_cel(item, schema["items"], f"{path}[{i}]"))
    return out


def supported_rule(rule: str) -> bool:
    """True when localkube can evaluate the CEL ``rule`` (``self.<path> == '<literal>'``)."""
    return _CEL_RE.match(rule) is not None


def _eval_rule(rule: str, v: Any) -> bool:
    m = _CEL_RE.match(rule)
    if m is None:
        return True  # unsupported rules are not enforced (documented limitation)
    cur: Any = v
    for part in m.group(1).strip(".").split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return bool(cur == m.group(2))


def prune(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Drop fields the schema does not know, in place (metadata is never pruned here).

    Returns:
        the dotted paths of the dropped fields, in document order (for the ``Warning: 299``
        header or the Strict-mode 400).
    """
    dropped: list[str] = []
    for key in list(obj):
        if key in ("apiVersion", "kind", "metadata"):
            continue
        props = schema.get("properties") or {}
        if key in props:
            _prune(obj[key], props[key], key, dropped)
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            dropped.append(key)
            del obj[key]
    return dropped


def _prune(v: Any, schema: dict[str, Any], path: str, dropped: list[str]) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(v, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        if props is None and addl is None:
            if schema.get("type") == "object":
                for key in list(v):
                    dropped.append(_join(path, key))
                    del v[key]
            return
        for key in list(v):
            if props and key in props:
                _prune(v[key], props[key], _join(path, key), dropped)
            elif isinstance(addl, dict):
                _prune(v[key], addl, _join(path, key), dropped)
            elif addl is True:
                continue
            else:
                dropped.append(_join(path, key))
                del v[key]
    elif isinstance(v, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(v):
            _prune(item, schema["items"], f"{path}[{i}]", dropped)


def apply_defaults(v: Any, schema: dict[str, Any]) -> None:
    """Set ``default`` values of absent properties, in place (structural defaulting)."""
    if isinstance(v, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in v and "default" in sub:
                v[key] = orjson.loads(orjson.dumps(sub["default"]))
            if key in v and key != "metadata":
                apply_defaults(v[key], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for key, sub_v in v.items():
                if key not in props:
                    apply_defaults(sub_v, addl)
    elif isinstance(v, list) and isinstance(schema.get("items"), dict):
        for item in v:
            apply_defaults(item, schema["items"])


def apply_merge(live: Any, applied: Any, schema: dict[str, Any] | None) -> Any:
    """Merge a server-side-apply configuration into a live custom resource (approximation).

    Maps merge key by key; lists marked ``x-kubernetes-list-type: map`` merge item by item on
    their ``x-kubernetes-list-map-keys`` (new items appended, matching items merged); other
    lists and scalars are replaced. Fields a manager stopped applying are not removed (no
    managedFields bookkeeping). Returns a new value; inputs are not modified.
    """
    sch = schema or {}
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        props = sch.get("properties") or {}
        addl = sch.get("additionalProperties")
        for key, value in applied.items():
            sub = props.get(key) if key in props else (addl if isinstance(addl, dict) else None)
            out[key] = apply_merge(live.get(key), value, sub) if key in live else value
        return out
    if (isinstance(live, list) and isinstance(applied, list)
            and sch.get("x-kubernetes-list-type") == "map"):
        keys = sch.get("x-kubernetes-list-map-keys") or []
        items_schema = sch.get("items") if isinstance(sch.get("items"), dict) else None
        merged = list(live)
        for item in applied:
            ident = tuple(item.get(k) for k in keys) if isinstance(item, dict) else None
            for i, cur in enumerate(merged):
                if isinstance(cur, dict) and ident is not None and tuple(
                    cur.get(k) for k in keys
                ) == ident:
                    merged[i] = apply_merge(cur, item, items_schema)
                    break
            else:
                merged.append(item)
        return merged
    return applied
