"""A bounded memo of a pure function of a pod, keyed by everything the function reads.

The watch of placed pods (:mod:`controller.placedwatch`) hands every pod the policy placed to
readers that re-derive something from it: the escape monitor whether its record reproduces
from its spec (:func:`rules.monitor.escape.placement_doubt`), the admission feed the Events
of its decision (:func:`rules.monitor.admitted.admission_events`). The replicas of one
workload placed alike give the same answer, so each distinct input is computed once:

- the *parts* of the pod (and of anything else) the function reads, as JSON (``orjson``,
  sorted keys), hashed to a 128-bit BLAKE2b key: equal keys are equal parts (a pod's creator
  cannot make two JSON texts collide);
- the *scope*: Python objects the function reads that the whole cluster shares (the parsed
  config, the node inventory), compared by identity: when one is another object (the config
  changed, a Node came or went), the memo is emptied, so it never holds an old config or
  inventory alive;
- the *context*: per-entry Python objects it also reads (a namespace's placement policy),
  compared by identity: another object is another input, computed again.

The caller must name in the parts every field the function reads (the modules that use it
say which, next to the function they memoize). A pod's ``spec`` goes in through
:func:`placement_spec`: without what the API server makes different in every pod of a
workload and no placement rule reads (the ServiceAccount token volume
``kube-api-access-<random>`` and its mounts), or no two replicas would share an entry.

At most ``size`` entries, least recently used first out; memory: a 16-byte key, the
context's references and the value per entry, and the scope's references. Parts JSON cannot
encode (not expected of a decoded watch event) are computed without the memo.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import orjson

from podplacement.rules.place.placement import CONTAINER_LISTS, IMAGE_VOLUME, VOLUMES

T = TypeVar("T")

#: Entries of a memo by default.
DEFAULT_SIZE = 4096


#: The fields of a container that no placement rule reads and that name a pod's own
#: volumes (the token volume's random name).
_UNREAD_CONTAINER_FIELDS = ("volumeMounts",)


def placement_spec(spec: Any) -> Any:
    """``spec`` as a memo's part: without its volumes that are not image volumes (no rule
    reads them: :func:`rules.place.placement.pod_images` reads a volume's ``image`` source
    only) and without its containers' ``volumeMounts`` (no rule reads them); the rest as it
    is (every other field may be read). ``tests/controller/test_podmemo.py`` checks that no
    module of ``rules/`` names ``volumeMounts`` and that volumes are read through
    ``pod_images`` alone. Anything else than a mapping is returned as it is."""
    if not isinstance(spec, Mapping):
        return spec
    out = dict(spec)
    volumes = spec.get(VOLUMES)
    if isinstance(volumes, list):
        out[VOLUMES] = [v for v in volumes if not isinstance(v, Mapping) or IMAGE_VOLUME in v]
    for kind in CONTAINER_LISTS:
        containers = spec.get(kind)
        if isinstance(containers, list):
            out[kind] = [{k: v for k, v in c.items() if k not in _UNREAD_CONTAINER_FIELDS}
                         if isinstance(c, Mapping) else c for c in containers]
    return out


class InputMemo(Generic[T]):
    """The memo (module docstring).

    Args:
        size: entries kept at most (>= 1).

    Attributes:
        hits / misses: calls answered from the memo / computed (misses include the calls
            whose parts did not encode).
    """

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("a memo keeps at least one entry")
        self.size = size
        self.hits = 0
        self.misses = 0
        self._memo: OrderedDict[bytes, tuple[tuple[object, ...], T]] = OrderedDict()
        self._scope: tuple[object, ...] = ()

    def __len__(self) -> int:
        return len(self._memo)

    def get(self, parts: Any, context: Sequence[object], compute: Callable[[], T],
            scope: Sequence[object] = ()) -> T:
        """``compute()``, or what it returned before for the same ``parts`` (JSON-like: what
        the function reads of the pod), the same ``context`` objects and the same ``scope``
        objects (both by identity; another scope empties the memo first).

        Raises:
            Exception: whatever ``compute`` raised (nothing is kept then).
        """
        scoped = tuple(scope)
        if len(scoped) != len(self._scope) or any(
                a is not b for a, b in zip(scoped, self._scope, strict=True)):
            self._memo.clear()
            self._scope = scoped
        try:
            text = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            self.misses += 1
            return compute()
        key = hashlib.blake2b(text, digest_size=16).digest()
        ctx = tuple(context)
        entry = self._memo.get(key)
        if entry is not None and len(entry[0]) == len(ctx) and all(
                a is b for a, b in zip(entry[0], ctx, strict=True)):
            self.hits += 1
            self._memo.move_to_end(key)
            return entry[1]
        self.misses += 1
        value = compute()
        self._memo[key] = (ctx, value)
        self._memo.move_to_end(key)
        while len(self._memo) > self.size:
            self._memo.popitem(last=False)
        return value
