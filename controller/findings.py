"""Evidence that an image digest cannot run on an architecture: what the exec-format-error
monitor saw and what verification found, per (image digest, architecture).

Pure and in memory (a bounded LRU); the monitor (:mod:`controller.execformatmonitor`) fills
it, and a placement rule that wants to stop placing a digest on an architecture reads it
(:meth:`FindingsStore.proven_wrong`). Times are unix seconds from the caller's clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

#: Verification statuses (``imageinspect.PlatformReport.status``) that prove the digest
#: wrong for the architecture.
PROVING_STATUSES = frozenset({"mismatch"})


@dataclass(frozen=True, slots=True)
class Verification:
    """The verification of one platform of a digest.

    Attributes:
        status: ``ok``, ``mismatch``, ``not-found``, ``no-entrypoint``, ``incomplete``,
            ``skipped`` or ``error`` (``imageinspect.PlatformReport.status``).
        reason: its one-sentence reason.
        checked_at: when it ran (unix seconds).
        reference: the reference verified (``repo@sha256:...``).
    """

    status: str
    reason: str
    checked_at: float
    reference: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What is known about (``digest``, ``architecture``).

    Attributes:
        errors: distinct exec format errors seen (one per pod, container and restart).
        first_seen, last_seen: unix seconds of the first and the latest of them (0: none).
        verification: the verification of this architecture's platform, if it ran.
    """

    digest: str
    architecture: str
    errors: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    verification: Verification | None = None


@dataclass
class FindingsStore:
    """(image digest, architecture) → :class:`Evidence`, at most ``max_entries`` pairs (the
    least recently updated go first).

    Observations are counted once: :meth:`record_error` takes an observation key (pod UID,
    container, restart count) and ignores one it has counted for that pair (at most
    ``max_observations`` keys kept per pair).
    """

    max_entries: int = 10_000
    max_observations: int = 64
    _items: OrderedDict[tuple[str, str], Evidence] = field(default_factory=OrderedDict)
    _seen: dict[tuple[str, str], OrderedDict[tuple[str, str, int], None]] = field(
        default_factory=dict)

    def _put(self, key: tuple[str, str], value: Evidence) -> Evidence:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            old, _ = self._items.popitem(last=False)
            self._seen.pop(old, None)
        return value

    def record_error(self, digest: str, architecture: str,
                     observation: tuple[str, str, int], at: float) -> Evidence:
        """Count one exec format error of ``digest`` on an ``architecture`` node.

        Args:
            observation: (pod UID, container name, restart count): counted once.
            at: when it was seen.
        Returns:
            the pair's evidence after counting.
        """
        key = (digest, architecture)
        current = self._items.get(key) or Evidence(digest, architecture)
        seen = self._seen.setdefault(key, OrderedDict())
        if observation in seen:
            return current
        seen[observation] = None
        while len(seen) > self.max_observations:
            seen.popitem(last=False)
        return self._put(key, replace(
            current, errors=current.errors + 1,
            first_seen=current.first_seen or at, last_seen=max(current.last_seen, at)))

    def record_verification(self, digest: str, architecture: str,
                            verification: Verification) -> Evidence:
        """Keep the verification of ``digest``'s ``architecture`` platform."""
        key = (digest, architecture)
        current = self._items.get(key) or Evidence(digest, architecture)
        return self._put(key, replace(current, verification=verification))

    def get(self, digest: str, architecture: str) -> Evidence | None:
        """The evidence of the pair, or None."""
        return self._items.get((digest, architecture))

    def verified(self, digest: str) -> bool:
        """Whether any platform of ``digest`` has a verification recorded."""
        return any(e.verification is not None for (d, _), e in self._items.items()
                   if d == digest)

    def proven_wrong(self, digest: str, architecture: str, *, min_errors: int = 2) -> bool:
        """Whether the pair is proven wrong: verification found a mismatch, or at least
        ``min_errors`` distinct exec format errors were seen."""
        e = self._items.get((digest, architecture))
        if e is None:
            return False
        v = e.verification
        return (v is not None and v.status in PROVING_STATUSES) or e.errors >= min_errors

    def forget(self, digest: str) -> None:
        """Drop every pair of ``digest``."""
        for key in [k for k in self._items if k[0] == digest]:
            self._items.pop(key, None)
            self._seen.pop(key, None)

    def __iter__(self) -> Iterator[Evidence]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)
