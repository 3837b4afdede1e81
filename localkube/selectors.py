"""Label and field selectors in the query-string syntax of the Kubernetes list API.

Label selectors follow apimachinery's ``labels.Parse`` grammar (``=``, ``==``, ``!=``, ``in``,
``notin``, ``key`` (exists) and ``!key``); field selectors follow ``fields.ParseSelector``
(``=``, ``==``, ``!=`` only, comma = AND). Error messages are worded as kube-apiserver v1.36
words them (``shared/reference/errors.json``, ``list-field-selectors.json``). Pure code: the
parsed selectors are frozen dataclasses matched against plain dicts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from localkube.errors import StatusError, bad_request

_KEY_RE = re.compile(r"[A-Za-z0-9_./-]+")


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``op`` is ``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` (the object's ``metadata.labels``) satisfy this requirement."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" also match objects without the key (labels.Selector semantics).
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector: the AND of its requirements (empty = everything)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """True when every requirement holds for ``labels`` (None = no labels)."""
        lab = labels or {}
        return all(r.matches(lab) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.requirements


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "(),":
            tokens.append(c)
            i += 1
        elif c == "!" and i + 1 < n and text[i + 1] == "=":
            tokens.append("!=")
            i += 2
        elif c == "=":
            if i + 1 < n and text[i + 1] == "=":
                tokens.append("==")
                i += 2
            else:
                tokens.append("=")
                i += 1
        elif c == "!":
            tokens.append("!")
            i += 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "(),=!":
                j += 1
            tokens.append(text[i:j])
            i = j
    return tokens


_OPERATORS = {"=", "==", "!=", "in", "notin"}


def _token_kind(tok: str) -> str:
    if tok in ("=", "==", "!=", "!", "(", ")", ","):
        return tok
    return "identifier"


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value.

    Returns:
        the selector (empty for None or blank text).
    Raises:
        StatusError: 400 BadRequest ``unable to parse requirement: ...`` on malformed input
            (labels.Parse; e.g. ``a===b`` gives ``found '=', expected: identifier``).
    """
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokenize(text)
    reqs: list[Requirement] = []
    i = 0

    def fail(found: str, expected: str) -> StatusError:
        return bad_request(f"unable to parse requirement: found '{found}', expected: {expected}")

    while i < len(toks):
        tok = toks[i]
        if tok == "!":
            if i + 1 >= len(toks) or _token_kind(toks[i + 1]) != "identifier":
                raise fail(toks[i + 1] if i + 1 < len(toks) else "", "identifier")
            reqs.append(Requirement(_check_key(toks[i + 1]), "!"))
            i += 2
        elif _token_kind(tok) != "identifier":
            raise fail(tok, "identifier")
        else:
            key = _check_key(tok)
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append(Requirement(key, "exists"))
            else:
                op = toks[i]
                if op not in _OPERATORS:
                    raise fail(op, "'=', '!=', '==', 'in', notin'")
                i += 1
                if op in ("in", "notin"):
                    if i >= len(toks) or toks[i] != "(":
                        raise fail(toks[i] if i < len(toks) else "", "'('")
                    i += 1
                    values: list[str] = []
                    while i < len(toks) and toks[i] != ")":
                        if toks[i] == ",":
                            i += 1
                            continue
                        if _token_kind(toks[i]) != "identifier":
                            raise fail(toks[i], "',', or ')'")
                        values.append(toks[i])
                        i += 1
                    if i >= len(toks):
                        raise fail("", "')'")
                    i += 1
                    reqs.append(Requirement(key, op, frozenset(values)))
                else:
                    value = ""
                    if i < len(toks) and _token_kind(toks[i]) == "identifier":
                        value = toks[i]
                        i += 1
                    elif i < len(toks) and toks[i] != ",":
                        raise fail(toks[i], "identifier")
                    reqs.append(Requirement(key, "!=" if op == "!=" else "=", frozenset([value])))
        if i < len(toks):
            if toks[i] != ",":
                raise fail(toks[i], "','")
            i += 1
    return LabelSelector(tuple(reqs))


def _check_key(key: str) -> str:
    if not _KEY_RE.fullmatch(key):
        raise bad_request(f"unable to parse requirement: invalid label key \"{key}\"")
    return key


def match_label_selector_dict(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str]
) -> bool:
    """Match a ``metav1.LabelSelector`` dict (``matchLabels`` / ``matchExpressions``).

    None matches nothing (as the API's nil selector); ``{}`` matches everything.
    """
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and key in labels and labels[key] in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# --- field selectors --------------------------------------------------------------------


def _get_path(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector: AND of ``(field, op, value)`` with op ``=`` or ``!=``."""

    terms: tuple[tuple[str, str, str], ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """True when every term holds for ``obj`` (missing fields read as ``""``)."""
        for field, op, value in self.terms:
            actual = _get_path(obj, field)
            if (actual == value) != (op == "="):
                return False
        return True

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.terms

    def value_of(self, field: str) -> str | None:
        """The value this selector requires for ``field`` with ``=``, else None."""
        for f, op, v in self.terms:
            if f == field and op == "=":
                return v
        return None


def parse_field_selector(
    text: str | None, supported: Callable[[str], bool]
) -> FieldSelector:
    """Parse a ``fieldSelector`` query value.

    Args:
        text: the raw value (``spec.nodeName=,status.phase=Pending``).
        supported: tells whether a field label is supported for the resource.
    Raises:
        StatusError: 400 ``invalid selector: '<text>'; can't understand '<term>'`` for set
            syntax or junk, 400 ``field label not supported: <field>`` for other fields.
    """
    if not text or not text.strip():
        return FieldSelector()
    terms: list[tuple[str, str, str]] = []
    # fields.ParseSelector sorts the terms before parsing them, so the error names the
    # first unparseable term in sorted order.
    for part in sorted(_split_unescaped(text)):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = split
        if not supported(field):
            raise bad_request(f"field label not supported: {field}")
        terms.append((field, op, value.replace("\\,", ",").replace("\\=", "=")))
    return FieldSelector(tuple(terms))


def _split_term(term: str) -> tuple[str, str, str] | None:
    for i in range(len(term)):
        rest = term[i:]
        for sym, op in (("!=", "!="), ("==", "="), ("=", "=")):
            if rest.startswith(sym):
                return term[:i], op, term[i + len(sym) :]
    return None


def _split_unescaped(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    esc = False
    for c in text:
        if esc:
            cur.append("\\" + c)
            esc = False
        elif c == "\\":
            esc = True
        elif c == ",":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    out.append("".join(cur))
    return out
