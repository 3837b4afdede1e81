"""The content of the admission policy's params object: image reference → platforms.

Issue 14, item 2 ("The params object"): the MutatingAdmissionPolicy ``podplacement-gate``
reads the cluster-scoped ``ImagePlatforms`` object named ``cluster``, whose ``spec.images``
maps an image reference, exactly as written in pod specs, to its sorted, de-duplicated,
comma-separated ``os/arch`` pairs (``"linux/amd64,linux/arm64"``). :class:`ParamsStore` keeps
those entries in memory: tag references expire after the config's ``cacheTTL``, references by
digest (content-addressed) do not, and the map is bounded in entries and in JSON bytes with
the least recently recorded entry out first. It is pure (no I/O, no clock of its own: every
call takes ``now``); :mod:`controller.paramswriter` publishes it.

Only anonymous results may be recorded: the caller records an image only when it inspected
the pod with no credentials at all (no pull secret, no global pull secret), so that no
namespace learns through the params object what another's credentials opened (issue 14).
The store cannot tell, so that filtering is the caller's job.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import orjson

from controller.config import PARAMS_MAX_BYTES, PARAMS_MAX_ENTRIES
from imageinspect import InvalidReference, parse_reference

#: One ``os`` or ``architecture`` as the CRD's value pattern allows it
#: (``deploy/crds/imageplatforms.yaml``: ``[a-z0-9_.-]+/[a-z0-9_.-]+`` per pair).
_PLATFORM_PART_RE = re.compile(r"[a-z0-9_.-]+")
#: ``maxLength`` of one ``spec.images`` value in the CRD: a longer value would make the
#: API server reject the whole object, so such an image is not recorded.
VALUE_MAX_LENGTH = 256


def platforms_value(pairs: Iterable[tuple[str, str]]) -> str | None:
    """The ``spec.images`` value of an image's (os, architecture) pairs.

    Args:
        pairs: (os, architecture) pairs, e.g. from
            :func:`controller.platforms.image_platform_pairs`; duplicates are allowed.

    Returns:
        The sorted, de-duplicated, comma-separated ``os/arch`` pairs
        (``"linux/amd64,linux/arm64"``), or ``None`` when the image cannot be published: no
        pairs, a pair outside the CRD's pattern ``[a-z0-9_.-]+/[a-z0-9_.-]+`` (one bad pair
        rejects the whole image: publishing the others would narrow what the admission
        policy places, and differ from the controller's own decision), or a value longer
        than :data:`VALUE_MAX_LENGTH`.
    """
    out: set[str] = set()
    for os_name, arch in pairs:
        if not (_PLATFORM_PART_RE.fullmatch(os_name) and _PLATFORM_PART_RE.fullmatch(arch)):
            return None
        out.add(f"{os_name}/{arch}")
    if not out:
        return None
    value = ",".join(sorted(out))
    return value if len(value) <= VALUE_MAX_LENGTH else None


def _value_pairs(value: str) -> list[tuple[str, str]] | None:
    """The pairs of a published value, or None when it is not ``os/arch[,os/arch...]``."""
    pairs: list[tuple[str, str]] = []
    for item in value.split(","):
        os_name, sep, arch = item.partition("/")
        if not sep:
            return None
        pairs.append((os_name, arch))
    return pairs


def is_pinned(image: str) -> bool | None:
    """True for a reference by digest (``name@sha256:<hex>``: content-addressed, so it
    never goes stale), False for a tag reference, None for a string that is not an image
    reference (:func:`imageinspect.parse_reference`'s grammar)."""
    try:
        return parse_reference(image).pinned
    except InvalidReference:
        return None


def _entry_bytes(image: str, value: str) -> int:
    # "key":"value" plus its separator (a comma, or for the first entry one of the braces):
    # the JSON object {"k1":"v1","k2":"v2"} is 1 + the sum of these.
    return len(orjson.dumps(image)) + len(orjson.dumps(value)) + 2


class _Entry:
    __slots__ = ("learned", "pinned", "size", "value")

    def __init__(self, value: str, learned: float, size: int, pinned: bool) -> None:
        self.value = value
        self.learned = learned
        self.size = size
        self.pinned = pinned


class ParamsStore:
    """The entries of ``ImagePlatforms/cluster`` ``spec.images``, kept by the controller.

    Rules (issue 14, item 2): an entry is what the controller learned by inspecting the
    image anonymously; a tag reference expires ``ttl_seconds`` after it was last recorded
    (the config's ``imageInspection.cacheTTL``); a reference by digest does not expire by
    age but is evicted like any other by the bounds; at most ``max_entries`` entries and at
    most ``max_bytes`` bytes of compact JSON for the whole ``spec.images`` map, the least
    recently recorded entries out first.

    Times (``now``) are seconds of one monotonic clock (``time.monotonic()``), the same for
    every call, never decreasing. The store is not thread-safe; in the controller's event
    loop no lock is needed (no method awaits).

    Publishing: :attr:`version` grows on every change of the published content; a writer
    takes ``version = store.version`` and ``store.images()``, writes them, and after a
    successful write calls :meth:`mark_clean(version) <mark_clean>`. :attr:`dirty` stays
    true after a failed write (``mark_clean`` was not called) and after a record that
    happened while the write was in flight (the version moved past the written one).

    Args:
        ttl_seconds: the age (seconds) at which a tag reference expires; 0 expires every tag
            reference at the next :meth:`expire`.
        max_entries: the bound on entries (default :data:`controller.config.PARAMS_MAX_ENTRIES`,
            the CRD's ``maxProperties``).
        max_bytes: the bound on the compact JSON size of ``spec.images`` (default
            :data:`controller.config.PARAMS_MAX_BYTES`), far below the API server's 1.5 MiB
            object limit.

    Raises:
        ValueError: a negative TTL, or a bound below 1 (``max_bytes`` below 2, the size of
            ``{}``).
    """

    def __init__(
        self,
        ttl_seconds: float,
        *,
        max_entries: int = PARAMS_MAX_ENTRIES,
        max_bytes: int = PARAMS_MAX_BYTES,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if max_bytes < 2:
            raise ValueError(f"max_bytes must be at least 2, not {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._ttl = 0.0
        self.set_ttl(ttl_seconds)
        # All entries, least recently recorded first (the LRU order of the bounds).
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # Tag references only, in the same order: the oldest first, so expire() stops at the
        # first entry that is still young.
        self._tags: OrderedDict[str, None] = OrderedDict()
        self._bytes = 0  # sum of _entry_bytes over _entries
        self._version = 0
        self._clean_version = 0

    # --- settings ---------------------------------------------------------------------
    @property
    def ttl_seconds(self) -> float:
        """The age (seconds) at which a tag reference expires; settable (config changes)."""
        return self._ttl

    @ttl_seconds.setter
    def ttl_seconds(self, seconds: float) -> None:
        self.set_ttl(seconds)

    def set_ttl(self, seconds: float) -> None:
        """Set the TTL of tag references (the config's ``imageInspection.cacheTTL``, in
        seconds); it applies to existing entries at the next :meth:`expire`.

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError(f"ttl_seconds must not be negative, not {seconds}")
        self._ttl = float(seconds)

    # --- reading ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, image: object) -> bool:
        return image in self._entries

    def get(self, image: str) -> str | None:
        """The published value of ``image`` (``"linux/amd64,linux/arm64"``), or None."""
        entry = self._entries.get(image)
        return entry.value if entry is not None else None

    def images(self) -> dict[str, str]:
        """The ``spec.images`` map to publish: image reference → sorted, comma-separated
        ``os/arch`` pairs, keys in sorted order (a stable object, whatever the LRU order)."""
        entries = self._entries
        return {image: entries[image].value for image in sorted(entries)}

    @property
    def json_size(self) -> int:
        """The size in bytes of ``spec.images`` as compact JSON (``orjson.dumps``), kept as
        a running count (never re-serialised)."""
        return self._bytes + 1 if self._entries else 2

    @property
    def version(self) -> int:
        """A counter of changes to the published content (entries added, changed, removed)."""
        return self._version

    @property
    def dirty(self) -> bool:
        """True when the published content changed since the last :meth:`mark_clean`."""
        return self._version != self._clean_version

    def mark_clean(self, version: int) -> None:
        """Record that the content of ``version`` (the :attr:`version` read before taking
        :meth:`images`) was written. Changes made since keep the store dirty."""
        self._clean_version = version

    def mark_dirty(self) -> None:
        """Force the next writer tick to write (e.g. the live object was found to differ)."""
        self._version += 1

    # --- changing ---------------------------------------------------------------------
    def record(self, image: str, pairs: Iterable[tuple[str, str]], now: float) -> bool:
        """Record what an anonymous inspection learned about ``image``.

        The entry becomes the most recently recorded one, and a tag reference's age restarts
        at ``now``. An image whose pairs cannot be published (:func:`platforms_value`: none,
        a malformed pair, too long) is not recorded, and an entry it had is removed (the tag
        may have moved; the old value would be stale). A string that is not an image
        reference, or an entry larger than ``max_bytes`` on its own, is not recorded.
        Recording may evict the least recently recorded entries to keep the bounds.

        Args:
            image: the reference exactly as written in the pod spec (the policy's lookup key).
            pairs: the image's (os, architecture) pairs
                (:func:`controller.platforms.image_platform_pairs`).
            now: monotonic seconds.

        Returns:
            True when the published content changed (an entry added, changed, removed or
            evicted); False for a refresh of an identical entry or an ignored image.
        """
        value = platforms_value(pairs)
        if value is None:
            return self.remove(image)
        entry = self._entries.get(image)
        if entry is None:
            pinned = is_pinned(image)
            if pinned is None:
                return False
            size = _entry_bytes(image, value)
            if size + 1 > self.max_bytes:
                return False
            self._entries[image] = _Entry(value, now, size, pinned)
            self._bytes += size
            if not pinned:
                self._tags[image] = None
            self._version += 1
            self._evict()
            return True
        self._entries.move_to_end(image)
        entry.learned = now
        if not entry.pinned:
            self._tags.move_to_end(image)
        if entry.value == value:
            return False
        size = _entry_bytes(image, value)
        if size + 1 > self.max_bytes:
            return self.remove(image)
        self._bytes += size - entry.size
        entry.value, entry.size = value, size
        self._version += 1
        self._evict()
        return True

    def remove(self, image: str) -> bool:
        """Remove ``image``'s entry; True when there was one."""
        entry = self._entries.pop(image, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        if not entry.pinned:
            del self._tags[image]
        self._version += 1
        return True

    def expire(self, now: float) -> int:
        """Remove the tag references recorded ``ttl_seconds`` or longer before ``now``
        (references by digest never expire by age). Returns the number removed."""
        removed = 0
        deadline = now - self._ttl
        entries, tags = self._entries, self._tags
        while tags:
            image = next(iter(tags))
            if entries[image].learned > deadline:
                break
            self.remove(image)
            removed += 1
        return removed

    def adopt(self, images: Mapping[str, object], now: float) -> int:
        """Take over the entries of a live object (``spec.images``) on controller start.

        They count as learned at ``now`` (their age is unknown), but never as more recent
        than an entry this store recorded itself: they go to the least recent end, at the
        oldest recorded time. An image already in the store keeps its own (fresher) value.
        Malformed entries (a key that is not an image reference, a value that is not
        ``os/arch[,os/arch...]`` of the CRD's pattern) are dropped; a value not in canonical
        form (unsorted, duplicated) is normalised. Either makes the store dirty, so the next
        write repairs the object; adopting exactly what is live does not.

        Args:
            images: the live ``spec.images`` (values other than strings are malformed).
            now: monotonic seconds.

        Returns:
            The number of entries adopted (after the bounds, which may evict some).
        """
        learned = now
        if self._entries:
            learned = min(now, self._entries[next(iter(self._entries))].learned)
        fresh: list[tuple[str, _Entry]] = []
        differs = False
        for image, raw in images.items():
            if image in self._entries:
                continue
            pairs = _value_pairs(raw) if isinstance(raw, str) else None
            value = platforms_value(pairs) if pairs is not None else None
            pinned = is_pinned(image) if value is not None else None
            if value is None or pinned is None:
                differs = True
                continue
            differs = differs or value != raw
            fresh.append((image, _Entry(value, learned, _entry_bytes(image, value), pinned)))
        # Put them in front of the recorded entries (least recent), in the order given.
        for image, entry in reversed(fresh):
            self._entries[image] = entry
            self._entries.move_to_end(image, last=False)
            self._bytes += entry.size
            if not entry.pinned:
                self._tags[image] = None
                self._tags.move_to_end(image, last=False)
        if differs:
            self._version += 1
        self._evict()
        return sum(1 for image, _ in fresh if image in self._entries)

    def _evict(self) -> int:
        """Drop the least recently recorded entries until both bounds hold; returns the
        number dropped (each is a change of the published content)."""
        evicted = 0
        while self._entries and (
            len(self._entries) > self.max_entries or self._bytes + 1 > self.max_bytes
        ):
            image, entry = self._entries.popitem(last=False)
            self._bytes -= entry.size
            if not entry.pinned:
                del self._tags[image]
            evicted += 1
        if evicted:
            self._version += 1
        return evicted
