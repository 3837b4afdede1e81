"""Publishing to the admission policy's params: what the controller learns goes into the
params store that :class:`controller.paramswriter.ParamsWriter` writes.

One job: decide whether and what to record in the :class:`rules.admit.imageparams.
ParamsStore`: anonymous inspection results (while this controller publishes the params), the
config's cache TTL, the removal of images a learned exclusion takes a platform from, and the
accepted PodPlacementPolicies. Reads the config (callables) and whether this process leads and
owns the admission objects; writes the store, and asks the params writer for an immediate
write (``flush``) after an exclusion or a policy change. Queues no key (the writer serves
:data:`controller.paramswriter.PARAMS_KEY`). Errors: a failed immediate write is the writer's
(logged there; its next tick writes again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from podplacement.controller.paramswriter import ParamsWriter
from podplacement.rules.admit import admissionpolicy
from podplacement.rules.admit.imageparams import ParamsStore
from podplacement.rules.config import (
    ADMISSION_AUTO,
    ExcludedPlatform,
    PlacementConfig,
)
from podplacement.rules.learn import touches
from podplacement.rules.platforms import image_platform_pairs
from podplacement.rules.policy import Ranking, params_policies

log = logging.getLogger(__name__)

ConfigSource = Callable[[], tuple[PlacementConfig, str | None]]


class ParamsPublisher:
    """What goes into the admission policy's params.

    Args:
        params: the params store (written here).
        writer: its writer (``flush`` asked for here; its ``stopped`` read).
        config_source: the current (config, parse error) pair.
        placement_config: the same with the exclusions this controller places with.
        owns_admission: True while this process runs the lifecycle (the policy is its).
        leading: True while this process holds the lease.
    """

    def __init__(self, params: ParamsStore, writer: ParamsWriter, *,
                 config_source: ConfigSource, placement_config: ConfigSource,
                 owns_admission: Callable[[], bool], leading: Callable[[], bool]) -> None:
        self._params = params
        self._writer = writer
        self._config_source = config_source
        self._placement_config = placement_config
        self._owns_admission = owns_admission
        self._leading = leading
        #: the last write of the params object a policy change asked for (:meth:`on_policies`)
        self.policy_flush: asyncio.Task[str] | None = None

    def publishing(self) -> bool:
        """True while this controller publishes the admission policy's params: it owns the
        policy (it runs the lifecycle), ``mechanism`` is ``Auto`` and the policy has a place
        branch (docs/how-it-decides.md, "Placement inside the API server")."""
        if not self._owns_admission():
            return False
        config = self._config_source()[0]
        return config.admission_mechanism == ADMISSION_AUTO and admissionpolicy.places(config)

    def apply_ttl(self) -> None:
        """Give the params store the config's ``imageInspection.cacheTTL`` (it applies to
        existing entries at the writer's next tick)."""
        self._params.ttl_seconds = self._config_source()[0].image_inspection.cache_ttl_seconds

    def publish(self, image: str, result: Any) -> None:
        """Record an anonymously inspected image in the admission policy's params, while
        :meth:`publishing` (by the reconciler, and by the admission feed for the images of
        pods placed at admission). The entry's learned time is the result's
        ``fetched_at`` (when a registry answered; a result served from the inspector's
        cache keeps the time of the answer it copies), or now for a result without one.
        A result an exclusion takes a platform from is not published (its entry goes)."""
        if not self.publishing():
            return
        self.apply_ttl()
        if touches(result, self._placement_config()[0].excluded):
            # the policy's annotation could not say why a platform is missing
            self._params.remove(image)
            return
        fetched_at = getattr(result, "fetched_at", None)
        digest = getattr(result, "digest", None)
        self._params.record(image, image_platform_pairs(result), time.time(),
                            learned=fetched_at if isinstance(fetched_at, int | float) else None,
                            digest=digest if isinstance(digest, str) else None)

    def _may_flush(self) -> bool:
        return self._leading() and self._owns_admission() and not self._writer.stopped

    async def on_excluded(self, excluded: tuple[ExcludedPlatform, ...]) -> None:
        """Take the excluded digests out of the admission policy's catalog, and write it
        now: its CEL cannot say why a platform is missing, so those pods are gated and
        placed by the webhook or the controller, whose decision annotation does."""
        removed = self._params.remove_digests({d for x in excluded for d in x.digests},
                                              images=[x.image for x in excluded if x.image])
        if removed:
            log.info("params: removed %s (a platform of theirs is excluded)", ", ".join(removed))
            if self._may_flush():
                await self._writer.flush()

    def on_policies(self, ranking: Ranking) -> None:
        """Publish the accepted policies with the params (the admission policy's CEL reads
        them), written at once rather than at the writer's next tick: until the params
        object holds a new policy, the admission policy places that namespace's pods without
        it (policy changes are rare: the pacing is not needed)."""
        if self._params.set_policies(params_policies(ranking)) and self._may_flush():
            self.policy_flush = asyncio.create_task(self._writer.flush(),
                                                    name="params flush (policies)")
