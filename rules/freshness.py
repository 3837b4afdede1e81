"""Which tags pulled with ``imagePullPolicy: Always`` the admission policy may place from its
catalog, and when the controller checks them again.

A pod that pulls a tag with ``Always`` is placed from a digest checked with the registry: the
webhook and the controller ask for the tag's current digest (one manifest ``HEAD``) on every
such pod. That check cannot close the race with the kubelet's own pull, which comes seconds
after admission (a tag re-pushed in between is pulled anyway, and the exec-format monitor is
the backstop): an answer a few seconds old is as safe as a fresh one. So the controller checks
each such tag *in use* every half of ``spec.admission.pullAlwaysFreshness`` (``window``) and
publishes, in the params object's ``spec.fresh`` (image reference → digest), the tags it
confirmed within the last ``window`` seconds; the policy places a pod whose ``Always`` images
are all there (:data:`rules.admit.predicates.CEL_KNOWN`) and gates the others as
before. docs/how-it-decides.md "Placement inside the API server" states the window.

A tag is *in use* while a pod that pulls it with ``Always`` was seen placed (any path) within
the last ``keep`` seconds (:meth:`PullAlwaysFreshness.use`); a tag no longer in use is not
checked and leaves ``spec.fresh``. Membership changes only when a tag starts or stops being
in use, fails a check or changes its digest, so a steady workload causes no params write.

Pure: no I/O and no clock of its own (monotonic seconds passed in); bounded to
``max_images`` tags, the least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["DEFAULT_KEEP_SECONDS", "MAX_IMAGES", "PullAlwaysFreshness"]

#: How long after its last pod a tag stays in use (checked and published).
DEFAULT_KEEP_SECONDS = 120.0
#: The most tags kept (the params object's ``spec.fresh`` is bounded the same in its CRD).
MAX_IMAGES = 1000


@dataclass(slots=True)
class _Tag:
    used: float
    confirmed: float | None = None
    digest: str | None = None
    checking: bool = False


class PullAlwaysFreshness:
    """The tags pulled with ``Always`` in use, and their last confirmed digest.

    Args:
        window: ``spec.admission.pullAlwaysFreshness`` in seconds; 0 publishes nothing.
        keep: seconds a tag stays in use after its last pod was seen.
        max_images: bound on the tags kept (least recently used out first).

    Raises:
        ValueError: a negative ``window`` or ``keep``, or ``max_images`` below 1.
    """

    def __init__(self, window: float, *, keep: float = DEFAULT_KEEP_SECONDS,
                 max_images: int = MAX_IMAGES) -> None:
        if window < 0 or keep < 0:
            raise ValueError(f"window and keep must not be negative ({window}, {keep})")
        if max_images < 1:
            raise ValueError(f"max_images must be at least 1, not {max_images}")
        self.window = window
        self.keep = keep
        self.max_images = max_images
        self._tags: OrderedDict[str, _Tag] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tags)

    @property
    def interval(self) -> float:
        """Seconds between two checks of a tag in use: half the window (at least 0.5 s)."""
        return max(0.5, self.window / 2)

    def use(self, image: str, now: float) -> None:
        """A pod pulling ``image`` (a tag reference) with ``Always`` was seen placed at
        ``now``."""
        tag = self._tags.get(image)
        if tag is None:
            self._tags[image] = _Tag(used=now)
            while len(self._tags) > self.max_images:
                self._tags.popitem(last=False)
        else:
            tag.used = max(tag.used, now)
            self._tags.move_to_end(image)

    def due(self, now: float) -> list[str]:
        """The tags to check now: in use, not being checked, never confirmed or confirmed at
        least :attr:`interval` ago; each is marked as being checked (report the outcome with
        :meth:`confirmed` or :meth:`failed`). Tags no longer in use are forgotten. Empty
        while the window is 0."""
        self._drop_unused(now)
        if self.window <= 0:
            return []
        out = []
        for image, tag in self._tags.items():
            if tag.checking:
                continue
            if tag.confirmed is None or now - tag.confirmed >= self.interval:
                tag.checking = True
                out.append(image)
        return out

    def confirmed(self, image: str, digest: str, now: float) -> None:
        """The registry answered for ``image`` at ``now`` (monotonic) with ``digest``."""
        tag = self._tags.get(image)
        if tag is not None:
            tag.checking = False
            tag.confirmed, tag.digest = now, digest

    def failed(self, image: str) -> None:
        """The check of ``image`` failed: it leaves the published set at once."""
        tag = self._tags.get(image)
        if tag is not None:
            tag.checking = False
            tag.confirmed = tag.digest = None

    def published(self, now: float) -> dict[str, str]:
        """``spec.fresh``: each tag in use whose digest was confirmed less than ``window``
        seconds before ``now`` → that digest, sorted by reference; ``{}`` while the window
        is 0."""
        if self.window <= 0:
            return {}
        return {image: tag.digest for image, tag in sorted(self._tags.items())
                if tag.digest is not None and tag.confirmed is not None
                and now - tag.confirmed < self.window and now - tag.used <= self.keep}

    def clear(self) -> None:
        """Forget every tag (a new leader starts from the pods it sees)."""
        self._tags.clear()

    def _drop_unused(self, now: float) -> None:
        for image in [i for i, t in self._tags.items() if now - t.used > self.keep]:
            del self._tags[image]
