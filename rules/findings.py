"""Evidence that an image digest cannot run on an architecture: what the exec-format-error
monitor saw and what verification found, per (image digest, architecture), and the rule
that says when that evidence is proof.

Pure and in memory (a bounded LRU); the monitor (:mod:`controller.execformatmonitor`) fills
it, and :func:`rules.learn.exclusions` turns the pairs proven wrong into the platforms
placement leaves out. Times are unix seconds from the caller's clock.

The rule (docs/exec-format-errors.md, "Learn"; :func:`proof_of`): a pair is proven wrong
when verification found its binary to be for another machine (``inspect --verify``:
status ``mismatch``), or when at least two distinct exec format errors (pod, container,
restart) were seen on nodes of that architecture. One error alone is not proof: a node's
broken binfmt setup, or an image of another OS, can fail once. Evidence lives for one TTL
(the config's ``imageInspection.cacheTTL``) after its latest part (an error or the
verification): :meth:`FindingsStore.expire` then forgets the pair, so a pair is excluded
until the TTL passes without a new error.

Who the evidence is about (docs/exec-format-errors.md, "Who it applies to"; the design rule
"evidence with cluster-wide effect is something the product established itself"): the
store keeps it per (digest, architecture, namespace). A verification is the controller's
own reading of the image's binaries: it is kept under namespace ``""`` and may exclude the
platform in every namespace. An exec format error is a message in a pod's status, which the
container itself can print (``/dev/termination-log``, ``FallbackToLogsOnError``): it is kept
under the pod's namespace and proves the pair for that namespace only. Times come from the
controller's clock; a time read from anywhere else (a published status) goes through
:func:`seen_at`, so it is never later than now.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from podplacement.rules.config import EXCLUSION_PROOF_VERIFICATION

#: Verification statuses (``imageinspect.PlatformReport.status``) that prove the digest
#: wrong for the architecture.
PROVING_STATUSES = frozenset({"mismatch"})
#: Distinct exec format errors that prove a pair wrong without verification (for the
#: namespace they were seen in).
MIN_ERRORS = 2
#: The two proofs, as :func:`proof_of` names them.
PROOF_VERIFICATION = EXCLUSION_PROOF_VERIFICATION
PROOF_ERRORS = "exec-format-errors"
#: The namespace key of evidence that applies in every namespace (a verification).
EVERY_NAMESPACE = ""


def seen_at(value: Any, now: float) -> float | None:
    """A time read from outside the controller's clock, as evidence may use it.

    Args:
        value: unix seconds (int or float; a bool, a string, NaN or a negative number is
            refused).
        now: the controller's clock, unix seconds.
    Returns:
        ``value`` cut to ``now`` (a time in the future is now: evidence never becomes
        younger than the moment it is read), or None when refused.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, now)


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
        errors: distinct exec format errors seen (one per pod, container and restart; after
            a restart at least the count the controller had published).
        first_seen, last_seen: unix seconds of the first and the latest of them (0: none).
        verification: the verification of this architecture's platform, if it ran.
        os: the nodes' ``kubernetes.io/os`` (``linux``).
        aliases: other digests of the same content for this platform: the digest placement
            saw for the pod's image reference, the index and the platform manifest digests
            of the verification.
        image: an image reference, as written in a pod, that ran it.
        namespace: whose pods the errors were seen in; :data:`EVERY_NAMESPACE` for the
            controller's own verification (module docstring).
    """

    digest: str
    architecture: str
    errors: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    verification: Verification | None = None
    os: str = "linux"
    aliases: frozenset[str] = frozenset()
    image: str = ""
    namespace: str = EVERY_NAMESPACE

    @property
    def digests(self) -> tuple[str, ...]:
        """:attr:`digest` and the :attr:`aliases`, sorted."""
        return tuple(sorted({self.digest, *self.aliases}))

    @property
    def latest(self) -> float:
        """Unix seconds of the latest evidence: an error or the verification."""
        checked = self.verification.checked_at if self.verification is not None else 0.0
        return max(self.last_seen, checked)

    @property
    def since(self) -> float:
        """Unix seconds of the earliest evidence kept (0: none)."""
        times = [t for t in (self.first_seen, self.verification.checked_at
                             if self.verification is not None else 0.0) if t > 0]
        return min(times) if times else 0.0


def proof_of(evidence: Evidence, *, min_errors: int = MIN_ERRORS) -> str | None:
    """The learn rule: what proves ``evidence``'s pair wrong, or None.

    Returns:
        :data:`PROOF_VERIFICATION` when its verification's status is in
        :data:`PROVING_STATUSES`, else :data:`PROOF_ERRORS` when at least ``min_errors``
        distinct exec format errors were counted in one namespace (evidence of
        :data:`EVERY_NAMESPACE` is never proven by errors), else None.
    """
    v = evidence.verification
    if v is not None and v.status in PROVING_STATUSES:
        return PROOF_VERIFICATION
    if evidence.namespace != EVERY_NAMESPACE and evidence.errors >= min_errors:
        return PROOF_ERRORS
    return None


@dataclass
class FindingsStore:
    """(image digest, architecture, namespace) → :class:`Evidence`, at most
    ``max_entries`` entries (the least recently updated go first). Errors are kept under the
    pod's namespace, verifications under :data:`EVERY_NAMESPACE` (module docstring).

    Observations are counted once: :meth:`record_error` takes an observation key (pod UID,
    container, restart count) and ignores one it has counted for that pair (at most
    ``max_observations`` keys kept per pair).
    """

    max_entries: int = 10_000
    max_observations: int = 64
    _items: OrderedDict[tuple[str, str, str], Evidence] = field(default_factory=OrderedDict)
    _seen: dict[tuple[str, str, str], OrderedDict[tuple[str, str, int], None]] = field(
        default_factory=dict)
    #: key → (errors counted here, the floor adopted from a published exclusion)
    _counts: dict[tuple[str, str, str], tuple[int, int]] = field(default_factory=dict)

    def _key(self, digests: Iterable[str], architecture: str,
             namespace: str) -> tuple[str, str, str]:
        """The key of the entry about the content ``digests`` name, for ``architecture``
        and ``namespace``: the entry keyed by one of them, else the first entry (least
        recently updated first) whose :attr:`Evidence.aliases` name one of them, else a new
        key under the first of ``digests``. The one rule that makes one content one entry,
        whichever of its digests the evidence arrives under (an adopted exclusion is keyed
        by its sorted first digest, a verification by the pod's ``imageID`` digest, which
        may be an alias of it). Linear in the entries when no key matches (at most
        ``max_entries``; evidence arrives once per error or verification)."""
        wanted = list(dict.fromkeys(digests))
        for d in wanted:
            if (d, architecture, namespace) in self._items:
                return (d, architecture, namespace)
        names = set(wanted)
        for key, e in self._items.items():
            if key[1] == architecture and key[2] == namespace and e.aliases & names:
                return key
        return (wanted[0], architecture, namespace)

    def _put(self, key: tuple[str, str, str], value: Evidence) -> Evidence:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            old, _ = self._items.popitem(last=False)
            self._seen.pop(old, None)
            self._counts.pop(old, None)
        return value

    def record_error(self, digest: str, architecture: str,
                     observation: tuple[str, str, int], at: float, *, namespace: str,
                     os: str = "linux", aliases: Iterable[str] = (),
                     image: str = "") -> Evidence:
        """Count one exec format error of ``digest`` on an ``architecture`` node, seen in a
        pod of ``namespace``.

        Args:
            observation: (pod UID, container name, restart count): counted once.
            at: when it was seen (the controller's clock).
            namespace: the pod's namespace (required: errors prove nothing beyond it).
            os: the node's OS; aliases: other digests of the same content (kept);
            image: the reference as written in the pod (kept when none is yet).
        Returns:
            the evidence of (digest, architecture, namespace) after counting.
        Raises:
            ValueError: ``namespace`` is empty.
        """
        if not namespace:
            raise ValueError("an exec format error is evidence for one namespace")
        key = self._key([digest], architecture, namespace)
        current = (self._items.get(key)
                   or Evidence(digest, architecture, os=os, namespace=namespace))
        current = replace(current, aliases=current.aliases
                          | (({digest} | set(aliases)) - {current.digest}),
                          image=current.image or image)
        seen = self._seen.setdefault(key, OrderedDict())
        if observation in seen:
            return self._put(key, current) if current != self._items.get(key) else current
        seen[observation] = None
        while len(seen) > self.max_observations:
            seen.popitem(last=False)
        counted, floor = self._counts.get(key, (0, 0))
        self._counts[key] = (counted + 1, floor)
        return self._put(key, replace(
            current, errors=max(counted + 1, floor),
            first_seen=current.first_seen or at, last_seen=max(current.last_seen, at)))

    def record_verification(self, digest: str, architecture: str,
                            verification: Verification, *, os: str = "linux",
                            aliases: Iterable[str] = (), image: str = "") -> Evidence:
        """Keep the verification of ``digest``'s ``architecture`` platform (and the other
        digests of that platform's content, ``aliases``; ``image``: a reference that names
        it, kept when none is yet), for every namespace. A verification that finds what the
        kept one found (a new leader verifying again what it took back) keeps the kept
        one's time: it confirms, it is not younger evidence. The entry is the one naming
        ``digest`` as its key or an alias (:meth:`_key`): an exclusion taken back under
        another digest of the same content is confirmed, not doubled."""
        key = self._key([digest], architecture, EVERY_NAMESPACE)
        current = self._items.get(key) or Evidence(digest, architecture, os=os)
        kept = current.verification
        if kept is not None and kept.status == verification.status:
            verification = replace(verification,
                                   checked_at=min(kept.checked_at, verification.checked_at))
        return self._put(key, replace(
            current, verification=verification, image=current.image or image,
            aliases=current.aliases | (({digest} | set(aliases)) - {current.digest})))

    def adopt(self, digests: Iterable[str], architecture: str, *, os: str, proof: str,
              errors: int, last_seen: float, image: str = "", reason: str = "",
              namespace: str = EVERY_NAMESPACE, since: float = 0.0) -> Evidence:
        """Take back a published exclusion (a controller restart, a new leader): the entry
        of its content and ``namespace`` gets its error count as a floor, its last
        evidence time, and a verification ``mismatch`` when that was the proof (kept for
        every namespace); an entry already known keeps its own, newer facts. The caller
        cuts the times to its clock (:func:`seen_at`). The entry is the one that already
        names one of ``digests`` (:meth:`_key`), so a verification arriving later under
        another digest of the same content confirms it instead of making a second one."""
        ordered = sorted(set(digests))
        if proof == PROOF_VERIFICATION:
            namespace = EVERY_NAMESPACE
        key = self._key(ordered, architecture, namespace)
        current = self._items.get(key) or Evidence(key[0], architecture, os=os,
                                                   image=image, namespace=namespace)
        counted, floor = self._counts.get(key, (0, 0))
        floor = max(floor, errors if namespace else 0)
        self._counts[key] = (counted, floor)
        verification = current.verification
        if proof == PROOF_VERIFICATION and (verification is None
                                            or verification.checked_at < last_seen):
            verification = Verification("mismatch", reason, last_seen)
        elif proof == PROOF_VERIFICATION and verification is not None and \
                verification.status in PROVING_STATUSES:
            # a new leader's verification that ran before this took the exclusion back
            # only confirms it: it keeps the published time (as in record_verification)
            verification = replace(verification, checked_at=last_seen)
        first = since if 0 < since <= last_seen else last_seen
        return self._put(key, replace(
            current, errors=max(counted, floor), last_seen=max(current.last_seen, last_seen),
            first_seen=current.first_seen or first, verification=verification,
            aliases=current.aliases | (set(ordered) - {current.digest})))

    def get(self, digest: str, architecture: str,
            namespace: str = EVERY_NAMESPACE) -> Evidence | None:
        """The evidence of (digest, architecture, namespace), or None; ``digest`` may be
        any digest of the entry's content (its key or an alias)."""
        return self._items.get(self._key([digest], architecture, namespace))

    def verified(self, digest: str) -> bool:
        """Whether any platform of ``digest`` has a verification recorded."""
        return any(e.verification is not None for (d, _, _), e in self._items.items()
                   if d == digest)

    def proven_wrong(self, digest: str, architecture: str, *,
                     namespace: str = EVERY_NAMESPACE, min_errors: int = MIN_ERRORS) -> bool:
        """Whether the pair is proven wrong (:func:`proof_of`) for every namespace, or, with
        ``namespace``, by the errors seen there."""
        e = self.get(digest, architecture, namespace)
        return e is not None and proof_of(e, min_errors=min_errors) is not None

    def expire(self, now: float, ttl: float) -> int:
        """Forget every entry whose latest evidence (:attr:`Evidence.latest`) is ``ttl``
        seconds or more before ``now``, after cutting any time later than ``now`` to
        ``now`` (evidence is never younger than the moment it is looked at, so an entry
        ends at most ``ttl`` after the first call that saw it). Returns how many were
        forgotten."""
        for key, e in list(self._items.items()):
            v = e.verification
            if e.first_seen > now or e.last_seen > now or (v is not None
                                                           and v.checked_at > now):
                self._items[key] = replace(
                    e, first_seen=min(e.first_seen, now), last_seen=min(e.last_seen, now),
                    verification=None if v is None else replace(
                        v, checked_at=min(v.checked_at, now)))
        old = [k for k, e in self._items.items() if e.latest <= now - ttl]
        for key in old:
            self._items.pop(key, None)
            self._seen.pop(key, None)
            self._counts.pop(key, None)
        return len(old)

    def forget(self, digest: str) -> None:
        """Drop every pair of ``digest``."""
        for key in [k for k in self._items if k[0] == digest]:
            self._items.pop(key, None)
            self._seen.pop(key, None)
            self._counts.pop(key, None)

    def __iter__(self) -> Iterator[Evidence]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)
