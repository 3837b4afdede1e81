"""Argument helpers shared by the ``podplacement`` subcommands: argparse ``type=`` checks
(:func:`positive_int`, :func:`positive_float`, :func:`non_negative_float`), DNS-1123 name checks
and one-line error text (:func:`one_line`, :func:`yaml_error_line`).

A leaf module: it imports nothing of ours, so every subcommand module (``webhook.cli``,
``controller.cli``, ``controller.explain_cli``, ``certs.cli``, ``imageinspect.cli``,
``demo.cli``) and the console script :mod:`podplacement.cli` above them can share it without
an import cycle (docs/design.md, "Import graph").
"""

from __future__ import annotations

import argparse
import math
import re


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (else argparse exits with status 2 and a message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (else argparse exits with status 2 and a message)."""
    return _finite(text, zero_allowed=False)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _finite(text, zero_allowed=True)


def _finite(text: str, *, zero_allowed: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and (value >= 0 if zero_allowed else value > 0)):
        bound = ">= 0" if zero_allowed else "> 0"
        raise argparse.ArgumentTypeError(f"must be {bound} and finite, got {text}")
    return value


def yaml_error_line(exc: Exception) -> str:
    """One line for a PyYAML error: ``YAML syntax error at line L, column C: PROBLEM``
    (1-based, from the error's mark) instead of PyYAML's multi-line dump."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    problem = " ".join(str(problem).split())
    if mark is not None:
        return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"not valid YAML: {problem}"


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 label (lowercase alphanumerics and ``-``, 1-63
    characters, alphanumeric at both ends): a namespace or Service name."""
    return bool(_DNS_LABEL.fullmatch(name))


def is_dns_subdomain(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 subdomain: DNS-1123 labels joined by dots, at most
    253 characters (a pod name, a DNS name in a certificate)."""
    return 0 < len(name) <= 253 and all(is_dns_label(label) for label in name.split("."))


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) folded into one space."""
    return " ".join(str(text).split())
