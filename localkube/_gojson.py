"""Decode JSON the way kube-apiserver reports failures: Go ``encoding/json`` error wording.

The real server answers a malformed body with ``400 BadRequest`` and a message that embeds the
Go decoder's error (``invalid character 'n' looking for beginning of object key string``,
``unexpected end of JSON input``, ``json: cannot unmarshal object into Go value of type ...``).
Python's :mod:`json` errors carry the position, so the common Go messages can be rebuilt from it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson


class GoJSONError(ValueError):
    """A JSON body that Go's decoder would reject; ``str(err)`` is the Go error text."""


def _char(doc: str, pos: int) -> str:
    """Go prints the offending byte quoted like a rune literal: ``'n'``, ``'\\''``."""
    ch = doc[pos]
    if ch == "'":
        return "'\\''"
    if ch == "\n":
        return "'\\n'"
    return f"'{ch}'"


def go_error_message(doc: str, err: json.JSONDecodeError) -> str:
    """Translate a :class:`json.JSONDecodeError` into Go ``encoding/json``'s wording.

    Args:
        doc: the text that failed to decode.
        err: Python's error (its ``msg`` and ``pos`` say what and where).

    Returns:
        e.g. ``invalid character 'n' looking for beginning of object key string``.
    """
    pos = err.pos
    if pos >= len(doc.rstrip()) or err.msg.startswith("Unterminated string"):
        return "unexpected end of JSON input"
    msg = err.msg
    if msg.startswith("Expecting property name"):
        context = "looking for beginning of object key string"
    elif msg.startswith("Expecting ':'"):
        context = "after object key"
    elif msg.startswith("Expecting ',' delimiter"):
        opener = _innermost_open(doc, pos)
        context = "after array element" if opener == "[" else "after object key:value pair"
    elif msg.startswith("Extra data"):
        context = "after top-level value"
    elif msg.startswith("Invalid control character"):
        context = "in string literal"
    elif msg.startswith("Invalid \\escape"):
        context = "in string escape code"
    else:
        literal = _LITERALS.get(doc[pos])
        if literal is not None:
            return _literal_error(doc, pos, literal)
        context = "looking for beginning of value"
    return f"invalid character {_char(doc, pos)} {context}"


_LITERALS = {"t": "true", "f": "false", "n": "null"}


def _literal_error(doc: str, pos: int, literal: str) -> str:
    """Go's scanner error inside ``true``/``false``/``null``."""
    for offset, expected in enumerate(literal[1:], start=1):
        if pos + offset >= len(doc):
            return "unexpected end of JSON input"
        if doc[pos + offset] != expected:
            return (
                f"invalid character {_char(doc, pos + offset)} in literal {literal} "
                f"(expecting '{expected}')"
            )
    return f"invalid character {_char(doc, pos)} looking for beginning of value"


def _innermost_open(doc: str, pos: int) -> str:
    """The bracket (``[`` or ``{``) enclosing ``pos``, ignoring brackets inside strings."""
    stack: list[str] = []
    in_string = False
    escaped = False
    for ch in doc[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def go_type_name(value: Any) -> str:
    """The JSON kind Go names in ``cannot unmarshal <kind> into Go value``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "number"


def loads(body: bytes | str) -> Any:
    """Parse JSON, raising :class:`GoJSONError` with Go's message on failure.

    Raises:
        GoJSONError: the body is not valid JSON (or not UTF-8).
    """
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
    except UnicodeDecodeError as exc:
        raise GoJSONError("invalid character in string literal") from exc
    if not text.strip():
        raise GoJSONError("unexpected end of JSON input")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GoJSONError(go_error_message(text, exc)) from exc


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (an orjson round trip: several times faster than
    :func:`copy.deepcopy` for API objects; falls back to it for non-JSON values)."""
    try:
        return orjson.loads(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return copy.deepcopy(value)
