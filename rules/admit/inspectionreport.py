"""The webhook's inspection report: what the webhook's anonymous inspections answered, as
the controller reads it to fill the admission policy's catalog without fetching the image
again (docs/how-it-decides.md, "The catalog fills itself from every path"). Pure: no I/O,
no clock of its own (every call takes ``now``).

The channel is one ConfigMap, :data:`REPORT_CONFIGMAP`, in the product's namespace. The
controller creates it; each webhook replica writes one key of its ``data`` (its pod name,
:func:`valid_key`) with a JSON merge patch of that key only, so replicas never overwrite each
other. The webhook's ServiceAccount may ``patch`` that one ConfigMap and nothing else of the
kind; a tenant (``edit`` in their own namespace) cannot write it, nor anyone who reaches the
webhook's Service (an AdmissionReview names no ConfigMap). A key's value is
:func:`encode_report`'s JSON::

    {"v": 1, "written": 1767225600,
     "images": {"registry.example/app:v1": ["linux/amd64,linux/arm64", "sha256:...", 1767225599]}}

``images`` maps an image reference, exactly as written in the pod spec, to its
``spec.images`` value (:func:`rules.admit.imageparams.platforms_value`), the digest of the
manifest the registry answered with and ``fetched_at``: the unix second the registry
answered (:attr:`imageinspect.ImageInfo.fetched_at`). Only anonymous answers are ever
written (the webhook inspects with no credentials at all).

The controller trusts the channel no more than a registry: :func:`read_report` bounds a
key's bytes and entries, and :func:`reported_result` validates the entry of an image it
looks up as it would a registry's answer (a reference of the grammar, a value of the CRD's
pattern in canonical form, a digest of the OCI grammar; a tag answered ``ttl`` or more ago
is not taken). A value of
another format (a newer webhook's, or garbage) is ignored whole with one reason. The report
is only ever *read* for an image the controller saw placed in a pod
(:mod:`controller.admissionfeed`): an entry no placed pod names never enters the catalog.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from podplacement.imageinspect import ImageInfo, Platform
from podplacement.rules.admit.imageparams import (
    is_pinned,
    learned_value,
    platforms_value,
    value_pairs,
)
from podplacement.rules.platforms import ImageLike, image_platform_pairs

__all__ = [
    "MAX_KEYS",
    "MAX_REFERENCE_LENGTH",
    "MAX_REPORT_BYTES",
    "MAX_REPORT_ENTRIES",
    "REPORT_CONFIGMAP",
    "REPORT_FORMAT",
    "STALE_KEY_SECONDS",
    "RawReport",
    "ReportEntry",
    "decode_written",
    "encode_report",
    "read_report",
    "report_entry",
    "reported_result",
    "valid_key",
]

#: The ConfigMap of the webhook's reports, in the product's namespace.
REPORT_CONFIGMAP = "podplacement-webhook-inspections"
#: The format ``"v"`` this release writes and reads.
REPORT_FORMAT = 1
#: Entries one replica's key holds at most (the most recently noted kept).
MAX_REPORT_ENTRIES = 1_000
#: JSON bytes of one replica's key at most: eight replicas fit a ConfigMap's 1 MiB.
MAX_REPORT_BYTES = 120_000
#: Keys (webhook replicas) the controller reads at most; more are ignored.
MAX_KEYS = 16
#: A key not written for this long belongs to a replica that is gone: the other replicas
#: remove it with their next write, and the controller does not wait for reports on its
#: account.
STALE_KEY_SECONDS = 300.0
#: Longest image reference accepted (the grammar's own bound on a name is 255 characters
#: plus a tag or digest).
MAX_REFERENCE_LENGTH = 512

_KEY_RE = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}")

#: (``spec.images`` value, digest, fetched_at unix seconds): one entry as written.
ReportEntry = tuple[str, str, int]


def valid_key(name: str) -> bool:
    """True when ``name`` can be a ConfigMap ``data`` key (``[-._a-zA-Z0-9]+``, at most 253
    characters): a pod name always can."""
    return bool(_KEY_RE.fullmatch(name))


def report_entry(result: ImageLike) -> ReportEntry | None:
    """The report entry of one anonymous inspection result (``imageinspect.ImageInfo``
    shape), or None when it has nothing the catalog could publish: not a result, a result
    an exclusion took a platform from (:class:`rules.learn.LearnedImage`), no platforms that fit
    the CRD's pattern (:func:`rules.admit.imageparams.platforms_value`), no digest of the
    OCI grammar, or no ``fetched_at`` (a result not built by the inspector)."""
    if not isinstance(getattr(result, "platforms", None), tuple | list):
        return None  # not a result (an exception stands for a failed inspection)
    if getattr(result, "excluded", ()):
        return None  # a result with platforms left out (rules.learn.LearnedImage)
    value = platforms_value(image_platform_pairs(result))
    digest = getattr(result, "digest", None)
    fetched = learned_value(getattr(result, "fetched_at", None))
    if value is None or not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
        return None
    if fetched is None:
        return None
    return value, digest, int(fetched)


def encode_report(entries: Mapping[str, ReportEntry], written: float) -> tuple[str, int]:
    """One replica's key value: ``entries`` (image → entry, the oldest first) as the module
    docstring's JSON, written at ``written`` (unix seconds).

    Returns:
        (the JSON text, how many entries it holds): the most recent
        :data:`MAX_REPORT_ENTRIES` that fit :data:`MAX_REPORT_BYTES` (older ones left out).
    """
    items = list(entries.items())[-MAX_REPORT_ENTRIES:]
    while True:  # one encoding, and a few more only when the bytes are over (rare)
        text = orjson.dumps({"v": REPORT_FORMAT, "written": int(written),
                             "images": dict(items)})
        if len(text) <= MAX_REPORT_BYTES or not items:
            return text.decode(), len(items)
        keep = min(len(items) - 1, int(len(items) * MAX_REPORT_BYTES / len(text) * 0.95))
        items = items[len(items) - keep:] if keep > 0 else []


def decode_written(text: object) -> float | None:
    """The ``written`` time of a key's value of any format version (unix seconds), or None
    when it is not a JSON object with one (the webhook reads it to prune the keys of
    replicas that are gone)."""
    if not isinstance(text, str) or len(text) > 4 * MAX_REPORT_BYTES:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return learned_value(doc.get("written")) if isinstance(doc, dict) else None


def _document(text: object) -> dict[str, Any] | str:
    """The decoded JSON object of a key, or the reason it is not one of this format."""
    if not isinstance(text, str):
        return "not a string"
    if len(text) > MAX_REPORT_BYTES:
        return f"{len(text)} bytes, over {MAX_REPORT_BYTES}"
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return "not JSON"
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("v") != REPORT_FORMAT:
        return f"format {str(doc.get('v'))[:20]!r}, not {REPORT_FORMAT}"
    if not isinstance(doc.get("images"), dict):
        return "no images object"
    return doc


@dataclass(frozen=True, slots=True)
class RawReport:
    """One replica's key, read but its entries not yet validated (:func:`read_report`).

    Attributes:
        written: when the replica wrote it (unix seconds, at most ``now``).
        images: image reference → its entry as written; validate one with
            :func:`reported_result` when it is needed (a key holds up to 1,000 entries and
            is rewritten every second; the controller looks up a few).
    """

    written: float
    images: Mapping[str, Any]


def read_report(text: object, *, now: float) -> RawReport | str:
    """Read one replica's key (one JSON decode, no per-entry work).

    Returns:
        A :class:`RawReport`, or the reason (one line, our own words) the whole value is
        ignored: not JSON, another format, no ``images`` object or more than
        :data:`MAX_REPORT_ENTRIES`, no valid ``written``.
    """
    doc = _document(text)
    if isinstance(doc, str):
        return doc
    written = learned_value(doc.get("written"))
    if written is None:
        return "no written time"
    images: dict[str, Any] = doc["images"]
    if len(images) > MAX_REPORT_ENTRIES:
        return f"{len(images)} images, over {MAX_REPORT_ENTRIES}"
    return RawReport(min(written, now), images)


def reported_result(image: str, raw: Any, *, now: float, ttl: float) -> ImageInfo | None:
    """The result a report's entry ``raw`` gives ``image``, validated as a registry's answer
    would be (module docstring), or None: malformed, or a tag reference answered ``ttl``
    (the config's ``imageInspection.cacheTTL``, seconds) or more before ``now``.

    Returns:
        an :class:`imageinspect.ImageInfo` with the reference as written, the digest,
        platforms ``os/arch`` without variant, an empty media type and ``fetched_at`` (not
        capped here: :meth:`rules.admit.imageparams.ParamsStore.record` counts a time after
        ``now`` as ``now``).
    """
    if raw is None:
        return None
    result = _entry(image, raw)
    if result is None or result.fetched_at is None:
        return None
    if result.fetched_at <= now - ttl and not is_pinned(image):
        return None
    return result


def _entry(image: str, raw: Any) -> ImageInfo | None:
    """One entry validated (module docstring), or None."""
    if len(image) > MAX_REFERENCE_LENGTH or is_pinned(image) is None:
        return None
    if not isinstance(raw, list) or len(raw) != 3:
        return None
    value, digest, fetched = raw
    if not isinstance(value, str) or not isinstance(digest, str):
        return None
    pairs = value_pairs(value)
    if pairs is None or platforms_value(pairs) != value or not _DIGEST_RE.fullmatch(digest):
        return None
    seconds = learned_value(fetched)
    if seconds is None or not math.isfinite(seconds):
        return None
    return ImageInfo(image, digest, "", tuple(Platform(os, arch) for os, arch in pairs),
                     seconds)
