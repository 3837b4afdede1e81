"""The content of the admission policy's params object: image reference → platforms.

The MutatingAdmissionPolicy ``podplacement-gate`` reads the ``ImagePlatformCatalog`` object
named ``cluster`` (docs/how-it-decides.md, "Placement inside the API server"). Its catalog is
written densely, a repository once for all its tags (:func:`split_reference`):

- ``spec.repositories``: repository (the reference up to its tag or digest, as written) →
  suffix (``":tag"``, ``"@sha256:..."``, ``":tag@sha256:..."`` or ``""``: repository +
  suffix is the image reference exactly as written in pod specs) → platform-set code;
- ``spec.platformSets``: code (a short string the controller assigns, stable while an entry
  uses it; a set nobody uses goes away) → ``{"platforms": "linux/amd64,linux/arm64"}``, the
  sorted, de-duplicated, comma-separated ``os/arch`` pairs;
- ``spec.learnedAt``: repository → suffix → when the controller learned that tag reference:
  the unix second at which a registry answered for it (references by digest have no item).

The policy's CEL finds an image with two map lookups (``repositories[?repo][?suffix]``) and
one more for its set; no list of entries is ever iterated. The release before wrote the
flat ``spec.images`` (reference → pairs) and ``spec.learned`` (reference → seconds): the
CRD keeps them, :meth:`ParamsStore.adopt_spec` reads them (an in-place upgrade keeps the
catalog), and the controller writes only the dense layout (:meth:`ParamsStore.catalog`).

:class:`ParamsStore` keeps the entries in memory: tag references expire ``cacheTTL`` after
they were learned (a restart, a new leader or a re-record of a cached copy never makes them
younger), references by digest (content-addressed) do not, and the catalog is bounded in
entries and in JSON bytes of its three maps with the least recently used entry out first: an
entry is used when it is recorded and when a pod using the image is seen placed
(:meth:`ParamsStore.touch`, which changes no published byte and so asks for no write). It is
pure (no I/O, no clock of its own: every call takes ``now``); :mod:`controller.paramswriter`
publishes it.

Only anonymous results may be recorded: the caller records an image only when it inspected
the pod with no credentials at all (no pull secret, no global pull secret), so that no
namespace learns through the params object what another's credentials opened. The store
cannot tell, so that filtering is the caller's job.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from podplacement.imageinspect import InvalidReference, parse_reference
from podplacement.rules.config import (
    LINUX,
    PARAMS_MAX_BYTES,
    PARAMS_MAX_ENTRIES,
    PARAMS_MAX_SETS,
)
from podplacement.rules.place.placement import (
    LIST_SEPARATOR,
    REASON_REQUIRED_ARCHITECTURES,
    RECORD_ARCHS,
    RECORD_OSES,
    RECORD_PLATFORMS,
    RECORD_REASON,
    RECORD_RESULT,
    Outcome,
    compact_json,
)
from podplacement.rules.tolerations import ArchTaint, taints_value

#: One ``os`` or ``architecture`` as the CRD's value pattern allows it
#: (``deploy/crds/imageplatformcatalog.yaml``: ``[a-z0-9_.-]+/[a-z0-9_.-]+`` per pair).
_PLATFORM_PART_RE = re.compile(r"[a-z0-9_.-]+")
#: ``maxLength`` of one ``spec.images`` value in the CRD: a longer value would make the
#: API server reject the whole object, so such an image is not recorded.
VALUE_MAX_LENGTH = 256


def platforms_value(pairs: Iterable[tuple[str, str]]) -> str | None:
    """The ``spec.images`` value of an image's (os, architecture) pairs.

    Args:
        pairs: (os, architecture) pairs, e.g. from
            :func:`rules.platforms.image_platform_pairs`; duplicates are allowed.

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


def value_pairs(value: str) -> list[tuple[str, str]] | None:
    """The (os, architecture) pairs of a ``spec.images`` value (``"linux/amd64,linux/arm64"``),
    or None when it is not ``os/arch[,os/arch...]`` (the parts are not checked against the
    CRD's pattern here: :func:`platforms_value` does)."""
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


def reference_digest(image: str) -> str | None:
    """The digest a reference by digest names (``name@sha256:<hex>``), else None."""
    try:
        return parse_reference(image).digest
    except InvalidReference:
        return None


def learned_value(raw: object) -> float | None:
    """A ``spec.learned`` value as unix seconds, or None when it is not one: a JSON number
    (``bool`` is not one), finite and not negative. The CRD allows integers only; a float
    is taken as it is."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    seconds = float(raw)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


# --- the split of a reference into (repository, suffix): one rule, Python and CEL ----------

#: The code of a platform set: what :func:`set_code` assigns (and what an adopted object's
#: code must look like to be kept).
_CODE_RE = re.compile(r"[a-z]{1,8}")
_CODE_LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: ``maxLength`` of a code in the CRD (``spec.repositories`` values, ``spec.platformSets`` keys).
CODE_MAX_LENGTH = 8


def split_reference(image: str) -> tuple[str, str]:
    """The (repository, suffix) of ``image``, as the catalog's keys; ``repository + suffix ==
    image`` for every string.

    The rule (its CEL is :func:`cel_split_cut`, checked against this offline on hostile
    strings): the cut is at the first ``@`` when there is one (a reference by digest; a
    ``name:tag@digest`` keeps ``name:tag`` as its repository, the tag being ignored by the
    runtime then), else at the last ``:`` when it comes after the last ``/`` (the tag: a
    registry's port is followed by a ``/``), else at the end (no tag: suffix ``""``).
    Positions count code points, as CEL's ``indexOf`` does. Because the two parts
    concatenate back to the string, two different strings never share a (repository,
    suffix): a lookup by the split finds exactly the reference recorded.
    """
    at = image.find("@")
    if at >= 0:
        cut = at
    else:
        colon = image.rfind(":")
        cut = colon if colon > image.rfind("/") else len(image)
    return image[:cut], image[cut:]


def cel_split_cut(var: str) -> str:
    """The CEL of :func:`split_reference`'s cut (an int) for the string variable ``var``;
    the repository is ``var.substring(0, cut)`` and the suffix ``var.substring(cut,
    size(var))``. Only ``indexOf``/``lastIndexOf`` without offsets, ``size`` and
    ``substring`` within bounds (kube-apiserver's strings library, v1.36.2)."""
    return (f"({var}.indexOf('@') >= 0 ? {var}.indexOf('@') : "
            f"{var}.lastIndexOf(':') > {var}.lastIndexOf('/') ? {var}.lastIndexOf(':') : "
            f"size({var}))")


def set_code(index: int) -> str:
    """The ``index``-th platform-set code (0 → ``"a"``, 25 → ``"z"``, 26 → ``"aa"``, ...:
    bijective base 26), the shortest codes first."""
    if index < 0:
        raise ValueError(f"a code index is not negative, not {index}")
    out = ""
    n = index + 1
    while n:
        n, rest = divmod(n - 1, 26)
        out = _CODE_LETTERS[rest] + out
    return out


def _code_index(code: str) -> int | None:
    """The index :func:`set_code` maps to ``code``, or None for a string that is none."""
    if not _CODE_RE.fullmatch(code):
        return None
    n = 0
    for ch in code:
        n = n * 26 + _CODE_LETTERS.index(ch) + 1
    return n - 1


#: The decision fields the admission policy takes from a platform set (its ``head``, then,
#: after the pod's tolerations, its ``tail``), in the order of the decision annotation;
#: :mod:`rules.admit.admissionpolicy` checks that order against its record's.
SET_HEAD_FIELDS = (RECORD_PLATFORMS, RECORD_OSES, RECORD_ARCHS)
SET_TAIL_FIELDS = (RECORD_RESULT, RECORD_REASON)


def platform_set(value: str) -> dict[str, Any]:
    """The ``spec.platformSets`` item of a ``"os/arch,..."`` value (:func:`platforms_value`):
    the value, and what the admission policy would otherwise compute from it for every pod
    whose images all have this set (docs/how-it-decides.md, "Placement inside the API
    server"):

    - ``platforms``: the value itself (what a reader of the catalog reads);
    - ``pairs``: its ``os/arch`` pairs, a list in the value's (sorted) order;
    - ``archs``: the architecture of each pair, in that order;
    - ``linux``: every pair is a linux one (only such a set is placed by the policy);
    - for a linux set, ``head`` and ``tail``: the text of the decision annotation's fields
      :data:`SET_HEAD_FIELDS` and :data:`SET_TAIL_FIELDS` for a pod placed on this set,
      each with its leading comma, exactly as :func:`rules.place.placement.compact_json`
      writes them (``,"platforms":[...],"oses":["linux"],"archs":[...]`` and
      ``,"result":"set","reason":"required architectures ..."``).
    """
    pairs = value.split(",")
    archs = [p.partition("/")[2] for p in pairs]
    linux = all(p.partition("/")[0] == LINUX for p in pairs)
    item: dict[str, Any] = {"platforms": value, "pairs": pairs, "archs": archs, "linux": linux}
    if linux:
        facts: dict[str, Any] = {
            RECORD_PLATFORMS: pairs, RECORD_OSES: [LINUX], RECORD_ARCHS: archs,
            RECORD_RESULT: str(Outcome.SET),
            RECORD_REASON: REASON_REQUIRED_ARCHITECTURES.format(LIST_SEPARATOR.join(archs))}
        for name, fields in (("head", SET_HEAD_FIELDS), ("tail", SET_TAIL_FIELDS)):
            item[name] = "," + compact_json({f: facts[f] for f in fields})[1:-1]
    return item


def _item_bytes(key: str, value_json_len: int) -> int:
    # "key":value plus its separator (a comma, or for the first item one of the braces):
    # the JSON object {"k1":v1,"k2":v2} is 1 + the sum of these; an empty one is 2 bytes.
    return len(orjson.dumps(key)) + 1 + value_json_len + 1


def _map_bytes(items: int, total: int) -> int:
    return 1 + total if items else 2


def catalog_maps(images: Mapping[str, str], learned: Mapping[str, int] | None = None
                 ) -> dict[str, Any]:
    """The dense catalog (``repositories``, ``platformSets``, ``learnedAt``) of a flat one:
    ``images`` (reference → ``"os/arch,..."``) and ``learned`` (tag reference → unix
    seconds), codes assigned to the sets in sorted order of their values. What the policy
    reads for a given table (the offline CEL checks build their params with it);
    :meth:`ParamsStore.catalog` is the same layout, with codes stable across changes."""
    codes = {value: set_code(n) for n, value in enumerate(sorted(set(images.values())))}
    repositories: dict[str, dict[str, str]] = {}
    learned_at: dict[str, dict[str, int]] = {}
    for image in sorted(images):
        repo, suffix = split_reference(image)
        repositories.setdefault(repo, {})[suffix] = codes[images[image]]
        if learned is not None and image in learned:
            learned_at.setdefault(repo, {})[suffix] = learned[image]
    return {"repositories": repositories,
            "platformSets": {code: platform_set(value) for value, code in codes.items()},
            "learnedAt": learned_at}


def flat_catalog(spec: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, object]]:
    """The flat (``images``, ``learned``) of a params object's ``spec`` in either layout:
    the dense one (``repositories``, ``platformSets``, ``learnedAt``) and the previous
    release's (``images``, ``learned``), the dense one winning for an image in both.
    Malformed parts (not maps, a code with no set, a set without ``platforms``) are left
    out; values are not checked here (:meth:`ParamsStore.adopt` does). For readers of a
    live object: the controller's adoption, explain, benchmarks and tests."""
    def as_map(value: object) -> Mapping[str, Any]:
        return value if isinstance(value, Mapping) else {}

    images: dict[str, str] = {}
    learned: dict[str, object] = {}
    for image, value in as_map(spec.get("images")).items():
        if isinstance(value, str):
            images[image] = value
    learned.update(as_map(spec.get("learned")))
    sets = as_map(spec.get("platformSets"))
    learned_at = as_map(spec.get("learnedAt"))
    for repo, suffixes in as_map(spec.get("repositories")).items():
        seconds = as_map(learned_at.get(repo))
        for suffix, code in as_map(suffixes).items():
            value = as_map(sets.get(code)).get("platforms") if isinstance(code, str) else None
            if not isinstance(value, str):
                continue
            images[repo + suffix] = value
            if suffix in seconds:
                learned[repo + suffix] = seconds[suffix]
            else:
                learned.pop(repo + suffix, None)
    return images, learned


class _Entry:
    __slots__ = ("code", "digest", "learned", "pinned", "repo", "size", "suffix", "value")

    def __init__(self, image: str, value: str, learned: float, pinned: bool,
                 digest: str | None = None) -> None:
        self.repo, self.suffix = split_reference(image)
        self.value = value
        self.code = ""  # its platform set's code, set when it enters the store
        self.learned = learned  # unix seconds: when a registry answered for it
        self.size = 0  # its items' bytes in spec.repositories and spec.learnedAt
        self.pinned = pinned
        self.digest = digest  # of the result recorded (not published); None: unknown

    @property
    def published_learned(self) -> int | None:
        """The ``spec.learnedAt`` value: whole seconds, rounded down (an entry read back
        after a restart is at most a second older, never younger); None for a digest."""
        return None if self.pinned else math.floor(self.learned)

    def item_bytes(self) -> int:
        """Its items' bytes: ``"suffix":"code"`` in its repository's map of
        ``spec.repositories`` and, for a tag, ``"suffix":seconds`` in ``spec.learnedAt``."""
        size = _item_bytes(self.suffix, len(self.code) + 2)
        if not self.pinned:
            size += _item_bytes(self.suffix, len(str(self.published_learned)))
        return size


class _Repo:
    """A repository's entries (suffix → entry) and how many are tag references."""

    __slots__ = ("entries", "key_bytes", "tags")

    def __init__(self, repo: str) -> None:
        self.entries: dict[str, _Entry] = {}
        self.tags = 0
        # "repo":{...} and its separator, less the inner map's own bytes
        self.key_bytes = len(orjson.dumps(repo)) + 2


class ParamsStore:
    """The entries of ``ImagePlatformCatalog/cluster``'s catalog (``spec.repositories``,
    ``spec.platformSets``, ``spec.learnedAt``: the module docstring), kept by the controller.

    Rules (docs/how-it-decides.md, "Placement inside the API server"): an entry is what the
    controller learned by inspecting the image anonymously; a tag reference expires ``ttl_seconds``
    after the moment a registry answered for it (the config's
    ``imageInspection.cacheTTL``), which the caller passes as ``learned``: re-recording a
    result the inspector served from its own cache keeps the entry's age, and so does a
    controller restart (:meth:`adopt_spec` reads ``spec.learnedAt``, or the previous
    release's ``spec.learned``). A reference by digest does
    not expire by age (its content cannot change) but is evicted like any other by the
    bounds; it has no ``spec.learnedAt`` item. At most ``max_entries`` entries and at most
    ``max_bytes`` bytes of compact JSON for the three maps together,
    the least recently used entries out first: :meth:`record` and :meth:`touch` (a pod of
    the image seen placed, by any path) make an entry the most recently used. The order is
    kept in memory only: it changes no published byte, so a touch never makes the store
    dirty (no write), and it only matters when a new entry evicts. Entries adopted from the
    live object start least recently used, oldest learned first (:meth:`adopt`).

    Times (``now``, ``learned``) are wall-clock unix seconds (``time.time()``): they are
    published and must mean the same after a restart, on another replica, which a monotonic
    clock does not. A time in the future is taken as ``now``; when ``now`` goes back (the
    wall clock was set back), entries learned after it count as learned at that ``now``,
    so a clock step never makes an entry live longer than ``ttl_seconds`` past the step.
    The store is not thread-safe; in the controller's event loop no lock is needed (no
    method awaits).

    Publishing: :attr:`version` grows on every change of the published content (including
    a learned time); a writer takes ``version = store.version`` and ``store.catalog()``,
    writes it, and after a successful write calls
    :meth:`mark_clean(version) <mark_clean>`. :attr:`dirty` stays true after a failed write
    (``mark_clean`` was not called) and after a record that happened while the write was in
    flight (the version moved past the written one).

    Args:
        ttl_seconds: the age (seconds) at which a tag reference expires; 0 expires every tag
            reference at the next :meth:`expire`. The caller sets the configured value from
            the start (and :meth:`set_ttl` on every config change).
        max_entries: the bound on entries (default
            :data:`rules.config.PARAMS_MAX_ENTRIES`, the CRD's ``maxProperties``).
        max_bytes: the bound on the compact JSON size of the three maps of
            :meth:`catalog` (default :data:`rules.config.PARAMS_MAX_BYTES`), far below the
            API server's 1.5 MiB object limit. At most
            :data:`rules.config.PARAMS_MAX_SETS` platform sets: an image of another set
            is not recorded then.

    Raises:
        ValueError: a negative TTL, or a bound below 1 (``max_bytes`` below 6, the size of
            three ``{}``).
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
        if max_bytes < 6:
            raise ValueError(f"max_bytes must be at least 6, not {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._ttl = 0.0
        self.set_ttl(ttl_seconds)
        # All entries, least recently used first (the LRU order of the bounds).
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # (learned, image) of tag references, oldest first; an item whose entry is gone or
        # was learned again since is stale and skipped (rebuilt when stale ones pile up).
        self._ages: list[tuple[float, str]] = []
        # The dense layout: repository -> its entries; platform sets by value and by code.
        self._repos: dict[str, _Repo] = {}
        self._tag_repos = 0  # repositories with a tag reference (keys of spec.learnedAt)
        self._set_code: dict[str, str] = {}  # value -> code
        self._set_users: dict[str, int] = {}  # value -> entries using it
        self._code_value: dict[str, str] = {}  # code -> value
        self._free_codes: list[int] = []  # indexes of codes given back (a heap)
        self._next_code = 0  # the first code index never given yet
        # Bytes of the three maps' items: entries (_Entry.size), repository keys (in
        # spec.repositories and, with a tag, spec.learnedAt) and platform sets.
        self._bytes = 0
        self._version = 0
        self._clean_version = 0
        self._latest_now = -math.inf  # the largest `now` seen (clock steps back: see above)
        # spec.policies: namespace -> accepted placement policies (rules.policy)
        self._policies: dict[str, list[dict[str, Any]]] = {}
        self._fresh: dict[str, str] = {}
        #: Entries dropped by the bounds since this store was made (least recently used
        #: first; expiry by age is not counted): ``podplacement_params_evictions_total``.
        self.evictions = 0
        # spec.architectureTaints: the architecture taints to tolerate (rules.tolerations)
        self._arch_taints: list[dict[str, str]] = []

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
        seconds); it applies to existing entries, by their learned time, at the next
        :meth:`expire`.

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

    def digest_of(self, image: str) -> str | None:
        """The digest of the result ``image``'s entry was recorded from (kept in memory
        only; a reference by digest names its own), or None when unknown (a tag reference
        adopted from the live object) or absent."""
        entry = self._entries.get(image)
        return entry.digest if entry is not None else None

    def remove_digests(self, digests: Iterable[str], *,
                       images: Iterable[str] = ()) -> list[str]:
        """Remove every entry whose recorded digest is one of ``digests``, and each of
        ``images`` whose digest is unknown (an entry adopted after a restart that may be
        the same content). Returns the images removed (what exclusions learned from exec
        format errors take out of the catalog, :mod:`rules.learn`)."""
        wanted = set(digests)
        doomed = [image for image, entry in self._entries.items() if entry.digest in wanted]
        doomed += [image for image in images
                   if image in self._entries and self._entries[image].digest is None
                   and image not in doomed]
        for image in doomed:
            self.remove(image)
        return doomed

    def learned_at(self, image: str) -> float | None:
        """When ``image``'s entry was learned (unix seconds, as kept in memory), or None."""
        entry = self._entries.get(image)
        return entry.learned if entry is not None else None

    def images(self) -> dict[str, str]:
        """The catalog flat: image reference → sorted, comma-separated ``os/arch`` pairs,
        keys in sorted order (the previous release's ``spec.images``; what
        :func:`flat_catalog` reads back from :meth:`catalog`)."""
        entries = self._entries
        return {image: entries[image].value for image in sorted(entries)}

    def learned(self) -> dict[str, int]:
        """The learned times flat: each tag reference of :meth:`images` → the unix second
        it was learned (rounded down), keys in sorted order (the previous release's
        ``spec.learned``). References by digest have no item (they never expire by age)."""
        entries = self._entries
        out: dict[str, int] = {}
        for image in sorted(entries):
            seconds = entries[image].published_learned
            if seconds is not None:
                out[image] = seconds
        return out

    def catalog(self) -> dict[str, Any]:
        """The dense catalog to publish (the module docstring): ``{"repositories": {repo:
        {suffix: code}}, "platformSets": {code: {"platforms": "os/arch,..."}},
        "learnedAt": {repo: {suffix: seconds}}}``, keys in sorted order (a stable object,
        whatever the LRU order); seconds rounded down; references by digest have no
        ``learnedAt`` item. Its compact JSON size is :attr:`json_size`."""
        repositories: dict[str, dict[str, str]] = {}
        learned_at: dict[str, dict[str, int]] = {}
        for name in sorted(self._repos):
            entries = self._repos[name].entries
            codes: dict[str, str] = {}
            seconds: dict[str, int] = {}
            for suffix in sorted(entries):
                entry = entries[suffix]
                codes[suffix] = entry.code
                published = entry.published_learned
                if published is not None:
                    seconds[suffix] = published
            repositories[name] = codes
            if seconds:
                learned_at[name] = seconds
        sets = {code: platform_set(self._code_value[code]) for code in sorted(self._code_value)}
        return {"repositories": repositories, "platformSets": sets, "learnedAt": learned_at}

    def code_of(self, image: str) -> str | None:
        """The platform-set code of ``image``'s entry, or None when absent."""
        entry = self._entries.get(image)
        return entry.code if entry is not None else None

    @property
    def json_size(self) -> int:
        """The size in bytes of the catalog's three maps (:meth:`catalog`:
        ``spec.repositories``, ``spec.platformSets``, ``spec.learnedAt``) as compact JSON
        (``orjson.dumps`` of each), kept as a running count (never re-serialised)."""
        # {...} is 1 + the sum of its items; an empty map is 2 bytes.
        return (self._bytes + (1 if self._repos else 2) + (1 if self._tag_repos else 2)
                + (1 if self._set_code else 2))

    @property
    def version(self) -> int:
        """A counter of changes to the published content (entries added, changed, removed,
        learned again)."""
        return self._version

    @property
    def dirty(self) -> bool:
        """True when the published content changed since the last :meth:`mark_clean`."""
        return self._version != self._clean_version

    def mark_clean(self, version: int) -> None:
        """Record that the content of ``version`` (the :attr:`version` read before taking
        :meth:`catalog`) was written. Changes made since keep the store
        dirty."""
        self._clean_version = version

    def policies(self) -> dict[str, list[dict[str, Any]]]:
        """The ``spec.policies`` map to publish: namespace → its accepted placement
        policies, highest priority first (:func:`rules.policy.params_policies`)."""
        return self._policies

    def fresh(self) -> dict[str, str]:
        """``spec.fresh``: the tags pulled with ``Always`` whose digest the controller
        confirmed within the freshness window (:mod:`rules.freshness`) → digest."""
        return dict(self._fresh)

    def set_fresh(self, fresh: Mapping[str, str]) -> bool:
        """Replace ``spec.fresh``; returns True (and makes the store dirty) when it
        changed."""
        value = dict(sorted(fresh.items()))
        if value == self._fresh:
            return False
        self._fresh = value
        self._version += 1
        return True

    def arch_taints(self) -> list[dict[str, str]]:
        """``spec.architectureTaints``: the ``{value, effect}`` of each architecture taint
        whose toleration the policy adds (:mod:`rules.tolerations`), sorted."""
        return [dict(t) for t in self._arch_taints]

    def set_arch_taints(self, taints: Iterable[ArchTaint]) -> bool:
        """Replace ``spec.architectureTaints`` (:meth:`rules.tolerations.ArchitectureTaints.
        known`); returns True (and makes the store dirty) when it changed."""
        value = taints_value(taints)
        if value == self._arch_taints:
            return False
        self._arch_taints = value
        self._version += 1
        return True

    def set_policies(self, policies: Mapping[str, list[dict[str, Any]]]) -> bool:
        """Replace ``spec.policies`` (:func:`rules.policy.params_policies` of a ranking,
        which keeps to the catalog CRD's bounds and ``rules.policy.POLICIES_MAX_BYTES``);
        returns True (and makes the store dirty) when it changed."""
        value = {ns: list(group) for ns, group in sorted(policies.items())}
        if value == self._policies:
            return False
        self._policies = value
        self._version += 1
        return True

    def mark_dirty(self) -> None:
        """Force the next writer tick to write (e.g. the live object was found to differ)."""
        self._version += 1

    # --- changing ---------------------------------------------------------------------
    def record(self, image: str, pairs: Iterable[tuple[str, str]], now: float, *,
               learned: float | None = None, digest: str | None = None) -> bool:
        """Record what an anonymous inspection learned about ``image``.

        The entry becomes the most recently used one (for the bounds). Its learned time
        becomes ``learned`` when that is newer than the entry's: a result the inspector
        served from its own cache carries the time of the registry answer it copies
        (:attr:`imageinspect.ImageInfo.fetched_at`), so re-recording it does not make the
        entry younger. An older result than the entry's (a cached copy, a lookup that
        started before the entry's) changes nothing but the entry's place in the bounds'
        order: the newest registry answer wins. A new tag reference whose ``learned`` is
        already ``ttl_seconds`` old is not recorded (it would expire at once). An image
        whose pairs cannot be published (:func:`platforms_value`: none, a malformed
        pair, too long) is not recorded, and an entry it had is removed (the tag may have
        moved; the old value would be stale). A string that is not an image reference, or
        an entry larger than ``max_bytes`` on its own, is not recorded. Recording may evict
        the least recently used entries to keep the bounds.

        Args:
            image: the reference exactly as written in the pod spec (the policy's lookup key).
            pairs: the image's (os, architecture) pairs
                (:func:`rules.platforms.image_platform_pairs`).
            now: unix seconds (``time.time()``).
            learned: unix seconds when a registry answered for this result; None: ``now``
                (a fresh answer). A time after ``now`` counts as ``now``.
            digest: the result's digest (``ImageInfo.digest``), kept in memory for
                :meth:`remove_digests`; not published.

        Returns:
            True when the published content changed (an entry added, changed, removed,
            evicted, or learned at a later second); False for a re-record that keeps the
            entry as published, an older result, or an ignored image.
        """
        self._observe(now)
        learned = now if learned is None else min(learned, now)
        value = platforms_value(pairs)
        if value is None:
            return self.remove(image)
        entry = self._entries.get(image)
        if entry is None:
            pinned = is_pinned(image)
            if pinned is None:
                return False
            if not pinned and learned <= now - self._ttl:
                return False  # already expired: never published
            entry = _Entry(image, value, learned, pinned,
                           digest or (reference_digest(image) if pinned else None))
            if self._solo_size(entry) > self.max_bytes or not self._set_room(value):
                return False
            self._add(image, entry)
            self._version += 1
            self._evict()
            return True
        self._entries.move_to_end(image)
        if learned < entry.learned:
            return False
        if digest is not None:
            entry.digest = digest
        published = (entry.value, entry.published_learned)
        if learned > entry.learned:
            entry.learned = learned
            self._push_age(image, entry)
        if (value, entry.published_learned) == published:
            return False
        self._detach(entry)
        entry.value = value
        if self._solo_size(entry) > self.max_bytes or not self._set_room(value):
            del self._entries[image]
            self._version += 1
            return True
        self._attach(entry)
        self._version += 1
        self._evict()
        return True

    def touch(self, image: str) -> bool:
        """Mark ``image``'s entry as the most recently used (a pod using it was seen
        placed): the bounds evict it last. Nothing published changes (not its value, not
        its learned time, so not its expiry), so the store does not become dirty and no
        write follows. Returns True when there is such an entry."""
        if image not in self._entries:
            return False
        self._entries.move_to_end(image)
        return True

    def remove(self, image: str) -> bool:
        """Remove ``image``'s entry; True when there was one."""
        entry = self._entries.pop(image, None)
        if entry is None:
            return False
        self._detach(entry)
        self._version += 1
        return True

    def expire(self, now: float) -> int:
        """Remove the tag references learned ``ttl_seconds`` or longer before ``now``
        (references by digest never expire by age). Returns the number removed."""
        self._observe(now)
        removed = 0
        deadline = now - self._ttl
        ages, entries = self._ages, self._entries
        while ages and ages[0][0] <= deadline:
            learned, image = heapq.heappop(ages)
            entry = entries.get(image)
            if entry is not None and not entry.pinned and entry.learned == learned:
                self.remove(image)
                removed += 1
        return removed

    def adopt_spec(self, spec: Mapping[str, Any], now: float) -> int:
        """:meth:`adopt` the catalog of a live object's ``spec`` in either layout
        (:func:`flat_catalog`: the dense one, or the flat ``spec.images``/``spec.learned``
        the release before wrote), keeping the live codes of the platform sets where it
        can. The store becomes dirty unless the live object holds exactly the dense
        catalog it would write (:meth:`catalog`) and no flat maps: an upgraded object is
        rewritten in the dense layout at the next write. Returns the entries adopted."""
        images, learned = flat_catalog(spec)
        hints: dict[str, str] = {}
        sets = spec.get("platformSets")
        if isinstance(sets, Mapping):
            for code, item in sets.items():
                value = item.get("platforms") if isinstance(item, Mapping) else None
                if isinstance(value, str) and isinstance(code, str):
                    hints.setdefault(value, code)
        version = self._version
        adopted = self.adopt(images, now, learned=learned, codes=hints)
        if self._version == version:
            published = self.catalog()
            if (spec.get("images") or spec.get("learned")
                    or any((spec.get(k) or {}) != v for k, v in published.items())):
                self._version += 1
        return adopted

    def adopt(self, images: Mapping[str, object], now: float, *,
              learned: Mapping[str, object] | None = None,
              codes: Mapping[str, str] | None = None) -> int:
        """Take over the entries of a live object (``spec.images``, ``spec.learned``) when
        the controller starts leading, keeping their ages.

        A tag reference keeps the learned time of ``learned`` (a time after ``now`` counts
        as ``now``, and makes the store dirty so the corrected time is written). A tag
        reference with no valid learned time (an object written before ``spec.learned``
        existed, or edited by hand) is **not adopted**: it counts as expired. Its age is
        unknown and may be anything up to the age of the object, so taking it as learned
        now would give a possibly stale entry a whole new TTL, which is what the ages are
        for; dropping it costs one anonymous inspection by the controller for the next pod
        of that image. A tag reference already ``ttl_seconds`` old is not adopted either. A
        reference by digest needs no learned time (it never expires by age). An image
        already in the store keeps its own entry. Adopted entries go to the least recent
        end of the bounds' order, oldest first. Malformed entries (a key that is not an
        image reference, a value that is not ``os/arch[,os/arch...]`` of the CRD's pattern)
        are dropped; a value not in canonical form (unsorted, duplicated) is normalised.
        Anything dropped or changed makes the store dirty, so the next write repairs the
        object; adopting exactly what is live does not.

        Args:
            images: the live ``spec.images`` (values other than strings are malformed).
            now: unix seconds (``time.time()``).
            learned: the live ``spec.learned`` (image → unix seconds; None: absent).
            codes: platform-set value → the code to give its set when that code is free
                (the live object's, so that an unchanged catalog reads back unchanged).

        Returns:
            The number of entries adopted (after the bounds, which may evict some).
        """
        self._observe(now)
        learned = learned or {}
        deadline = now - self._ttl
        fresh: list[tuple[str, _Entry]] = []
        differs = any(image not in images for image in learned)
        for image, raw in images.items():
            if image in self._entries:
                continue
            pairs = value_pairs(raw) if isinstance(raw, str) else None
            value = platforms_value(pairs) if pairs is not None else None
            pinned = is_pinned(image) if value is not None else None
            if value is None or pinned is None:
                differs = True
                continue
            differs = differs or value != raw
            seconds = now if pinned else learned_value(learned.get(image))
            if seconds is None or (not pinned and min(seconds, now) <= deadline):
                differs = True  # unknown age, or already expired: not adopted
                continue
            if pinned:
                differs = differs or image in learned
            elif seconds > now:
                seconds, differs = now, True
            entry = _Entry(image, value, seconds, pinned,
                           reference_digest(image) if pinned else None)
            fresh.append((image, entry))
        # Put them in front of the recorded entries (least recent), the oldest first.
        fresh.sort(key=lambda item: item[1].learned)
        hints = codes or {}
        for image, entry in reversed(fresh):
            if not self._set_room(entry.value):
                differs = True
                continue
            self._add(image, entry, hints.get(entry.value))
            self._entries.move_to_end(image, last=False)
        if differs:
            self._version += 1
        self._evict()
        return sum(1 for image, _ in fresh if image in self._entries)

    # --- internals ----------------------------------------------------------------------
    def _observe(self, now: float) -> None:
        """Note ``now``; when it went back (the wall clock was set back), entries learned
        after it count as learned at ``now``."""
        if now >= self._latest_now:
            self._latest_now = now
            return
        self._latest_now = now
        for image, entry in self._entries.items():
            if entry.learned > now:
                before = entry.published_learned
                entry.learned = now
                self._push_age(image, entry)
                if entry.published_learned != before:
                    size = entry.item_bytes()
                    self._bytes += size - entry.size
                    entry.size = size
                    self._version += 1

    def _add(self, image: str, entry: _Entry, code_hint: str | None = None) -> None:
        """Add a new entry at the most recent end (no version change, no bounds)."""
        self._entries[image] = entry
        self._attach(entry, code_hint)
        self._push_age(image, entry)

    def _attach(self, entry: _Entry, code_hint: str | None = None) -> None:
        """Put ``entry`` (already in ``_entries``) into its repository and platform set,
        and count its bytes."""
        entry.code = self._use_set(entry.value, code_hint)
        entry.size = entry.item_bytes()
        repo = self._repos.get(entry.repo)
        if repo is None:
            repo = self._repos[entry.repo] = _Repo(entry.repo)
            self._bytes += repo.key_bytes + 1
        if not entry.pinned:
            if not repo.tags:
                self._tag_repos += 1
                self._bytes += repo.key_bytes + 1
            repo.tags += 1
        repo.entries[entry.suffix] = entry
        self._bytes += entry.size

    def _detach(self, entry: _Entry) -> None:
        """Take ``entry`` out of its repository and platform set (the reverse of
        :meth:`_attach`); its age item goes stale."""
        repo = self._repos[entry.repo]
        del repo.entries[entry.suffix]
        self._bytes -= entry.size
        if not entry.pinned:
            repo.tags -= 1
            if not repo.tags:
                self._tag_repos -= 1
                self._bytes -= repo.key_bytes + 1
        if not repo.entries:
            del self._repos[entry.repo]
            self._bytes -= repo.key_bytes + 1
        self._release_set(entry.value)

    def _use_set(self, value: str, code_hint: str | None) -> str:
        """The code of ``value``'s platform set, creating the set (with ``code_hint`` when
        that is a free code, else the first free one) when no entry uses it yet."""
        code = self._set_code.get(value)
        if code is None:
            hint = _code_index(code_hint) if code_hint is not None else None
            if hint is not None and code_hint not in self._code_value:
                code = code_hint
            else:
                while self._free_codes and set_code(self._free_codes[0]) in self._code_value:
                    heapq.heappop(self._free_codes)
                if self._free_codes:
                    code = set_code(heapq.heappop(self._free_codes))
                else:
                    while set_code(self._next_code) in self._code_value:
                        self._next_code += 1
                    code = set_code(self._next_code)
                    self._next_code += 1
            assert code is not None
            self._set_code[value] = code
            self._code_value[code] = value
            self._set_users[value] = 0
            self._bytes += self._set_bytes(code, value)
        self._set_users[value] += 1
        return code

    def _set_room(self, value: str) -> bool:
        """``value`` has a platform set, or there is room for one more
        (:data:`rules.config.PARAMS_MAX_SETS`, the CRD's ``maxProperties``)."""
        return value in self._set_code or len(self._set_code) < PARAMS_MAX_SETS

    def _release_set(self, value: str) -> None:
        self._set_users[value] -= 1
        if self._set_users[value]:
            return
        code = self._set_code.pop(value)
        del self._set_users[value], self._code_value[code]
        self._bytes -= self._set_bytes(code, value)
        index = _code_index(code)
        if index is not None and index < self._next_code:
            heapq.heappush(self._free_codes, index)

    @staticmethod
    def _set_bytes(code: str, value: str) -> int:
        return _item_bytes(code, len(orjson.dumps(platform_set(value))))

    def _solo_size(self, entry: _Entry) -> int:
        """The JSON bytes of a catalog holding ``entry`` alone (code ``a``)."""
        key = len(orjson.dumps(entry.repo)) + 2
        code = entry.code or set_code(0)
        items = _item_bytes(entry.suffix, len(code) + 2)
        size = 1 + key + 1 + items
        if entry.pinned:
            size += 2
        else:
            size += 1 + key + 1 + _item_bytes(entry.suffix, len(str(entry.published_learned)))
        return size + 1 + self._set_bytes(code, entry.value)

    def _push_age(self, image: str, entry: _Entry) -> None:
        if entry.pinned:
            return
        heapq.heappush(self._ages, (entry.learned, image))
        if len(self._ages) > 2 * len(self._entries) + 64:
            self._ages = [(e.learned, i) for i, e in self._entries.items() if not e.pinned]
            heapq.heapify(self._ages)

    def _evict(self) -> int:
        """Drop the least recently used entries until both bounds hold; returns the
        number dropped (each is a change of the published content)."""
        evicted = 0
        while self._entries and (
            len(self._entries) > self.max_entries or self.json_size > self.max_bytes
        ):
            _image, entry = self._entries.popitem(last=False)
            self._detach(entry)
            evicted += 1
        if evicted:
            self._version += 1
            self.evictions += evicted
        return evicted
