"""The freshness checks of the tags pulled with ``Always`` (the work-queue key
:data:`FRESH_KEY`).

One job: keep ``spec.fresh`` of the admission policy's params true: the tags pulled with
``Always`` by placed anonymous pods (:meth:`AlwaysTagChecks.used`) have their digest checked
again within ``spec.admission.pullAlwaysFreshness`` (one manifest ``HEAD`` through the
inspector's ``pull_always``), and those confirmed in the window are published
(:class:`rules.freshness.PullAlwaysFreshness`). Reads the config, the inspector and
whether this controller leads and publishes the params (callables); writes the params store
(``set_fresh``, and a moved digest's result through ``publish``). The key :data:`FRESH_KEY`
is queued by the leadership term (:class:`controller.term.LeadershipTerm`) and served by
:meth:`AlwaysTagChecks.check`, which asks to run again after each pass. Errors: a registry
error fails the one tag (it leaves ``spec.fresh`` at once); nothing here raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import PlacementConfig
from podplacement.rules.freshness import PullAlwaysFreshness

log = logging.getLogger(__name__)

#: The work-queue key of the checks of the tags pulled with ``Always`` in use
#: (:meth:`AlwaysTagChecks.check`).
FRESH_KEY = "fresh:cluster"
#: How many of those checks run at once.
FRESH_CONCURRENCY = 8


class AlwaysTagChecks:
    """The checks of the tags pulled with ``Always`` in use.

    Args:
        freshness: the tags in use and their confirmed digests (leader only).
        params: the params store (``spec.fresh`` and the catalog's entries).
        config_source: the current (config, parse error) pair.
        inspector: returns the current image inspector.
        publishing: True while this controller publishes the params.
        publish: records one anonymous inspection result in the params.
        leading: True while this process holds the lease.
        stopped: True while the params writer is stopped (no pass runs then).
    """

    def __init__(self, freshness: PullAlwaysFreshness, params: ParamsStore, *,
                 config_source: Callable[[], tuple[PlacementConfig, str | None]],
                 inspector: Callable[[], Any], publishing: Callable[[], bool],
                 publish: Callable[[str, Any], None], leading: Callable[[], bool],
                 stopped: Callable[[], bool]) -> None:
        self.freshness = freshness
        self._params = params
        self._config_source = config_source
        self._inspector = inspector
        self._publishing = publishing
        self._publish = publish
        self._leading = leading
        self._stopped = stopped

    def used(self, image: str) -> None:
        """A placed anonymous pod pulls ``image`` with ``Always``: keep checking the tag."""
        if self._leading() and self._publishing():
            self.freshness.use(image, time.monotonic())

    async def check(self, key: str = FRESH_KEY) -> float | None:
        """The reconciler of :data:`FRESH_KEY`: check the digest of each tag pulled with
        ``Always`` in use that is due (one manifest ``HEAD``, through the inspector's
        ``pull_always``; a moved digest is inspected and published anew, its platforms
        included), then publish the tags confirmed within ``pullAlwaysFreshness`` as
        ``spec.fresh`` (the writer's next tick writes a change). Runs again every half of
        the window; publishes nothing while this controller does not publish the params.

        Returns:
            Seconds until the next pass (:attr:`rules.freshness.
            PullAlwaysFreshness.interval`), None while stopped."""
        if self._stopped():
            return None
        config = self._config_source()[0]
        self.freshness.window = (config.admission_pull_always_freshness
                                 if self._publishing() else 0.0)
        due = self.freshness.due(time.monotonic())
        if due:
            gate = asyncio.Semaphore(FRESH_CONCURRENCY)
            await asyncio.gather(*(self._check_one(image, gate) for image in due))
        self._params.set_fresh(self.freshness.published(time.monotonic()))
        return self.freshness.interval

    async def _check_one(self, image: str, gate: asyncio.Semaphore) -> None:
        """One tag: confirmed with its digest (and its result published, so a moved digest
        changes the catalog too), or failed (it leaves ``spec.fresh`` at once)."""
        async with gate:
            try:
                result = await self._inspector().inspect(image, (), pull_always=True)
            except Exception as exc:  # a registry error: the tag is not fresh
                log.info("always tag %s: not confirmed: %s", image, exc)
                self.freshness.failed(image)
                return
        digest = getattr(result, "digest", None)
        if not isinstance(digest, str) or not digest:
            self.freshness.failed(image)
            return
        if self._params.digest_of(image) != digest:
            self._publish(image, result)
        if image in self._params:
            self.freshness.confirmed(image, digest, time.monotonic())
        else:  # not publishable (an exclusion, a platform outside the CRD's pattern)
            self.freshness.failed(image)
