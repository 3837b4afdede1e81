"""The controller's image inspector, built for the current config.

One job: hand out the ``imageinspect.Inspector`` that matches the config's cache TTL,
registry timeout and refused networks (``spec.imageInspection.refusedNetworks``) and the
registry rules in use (the ConfigMap's, else ``--registries-conf``,
with ``--insecure-registry`` on top: :func:`controller.registriessource.registries_from`),
building a new one when one of them changes. Reads the config and the registry rules
(callables); writes nothing and queues no key. An inspector replaced while lookups may still
use it is closed 60 s later. An inspector passed in (tests) is used as it is, never rebuilt
nor closed. Errors: none of its own; the inspector's registry errors reach its callers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from podplacement.controller.registriessource import LoadedRegistries, registries_from
from podplacement.rules.config import PlacementConfig
from podplacement.rules.platforms import ImageLike


class InspectorSource:
    """The current image inspector.

    Args:
        inspector: an ``imageinspect.Inspector``-like object to use as it is; None: one built
            here from the config and the options below (and rebuilt on their change).
        config_source: the current (config, parse error) pair.
        registries: the registry rules last read from the ConfigMap (None: none in use).
        registries_conf: ``--registries-conf`` (a file path) or None.
        insecure: ``--insecure-registry`` hosts (``host[:port]``).
        retries: the inspector's retries of a registry request.
        ca_bundles: registry ``host[:port]`` → extra PEM CA certificates.
    """

    def __init__(self, inspector: Any,
                 config_source: Callable[[], tuple[PlacementConfig, str | None]],
                 registries: Callable[[], LoadedRegistries | None], *,
                 registries_conf: str | None, insecure: tuple[str, ...], retries: int,
                 ca_bundles: Mapping[str, bytes]) -> None:
        self._inspector = inspector
        self._own = inspector is None
        self._key: tuple[float, float, str | None, tuple[Any, ...]] | None = None
        self._config_source = config_source
        self._registries = registries
        self._registries_conf = registries_conf
        self._insecure = insecure
        self._retries = retries
        self._ca_bundles = ca_bundles

    def current(self) -> Any:
        """The image inspector for the current config (rebuilt when the cache TTL, the
        registry timeout, the refused networks or the registry rules of the ConfigMap
        change; the rules follow :func:`registries_from`)."""
        config, _ = self._config_source()
        loaded = self._registries()
        key = (config.image_inspection.cache_ttl_seconds,
               config.image_inspection.registry_timeout_seconds,
               loaded.digest if loaded is not None else None,
               config.image_inspection.refused_networks)
        if self._inspector is not None and (not self._own or key == self._key):
            return self._inspector
        from podplacement.imageinspect import Inspector

        registries = registries_from(
            config_map=loaded.registries if loaded is not None else None,
            conf_file=self._registries_conf, insecure=self._insecure,
        )
        old = self._inspector
        self._inspector = Inspector(registries=registries, cache_ttl=key[0], timeout=key[1],
                                    retries=self._retries, ca_bundles=dict(self._ca_bundles),
                                    refused_networks=key[3])
        self._key = key
        if old is not None:
            # Lookups in flight keep using the old one; close it a little later.
            asyncio.get_running_loop().call_later(
                60.0, lambda: asyncio.ensure_future(old.aclose())
            )
        return self._inspector

    async def inspect(self, image: str, credentials: Sequence[Any] = (), *,
                      pull_always: bool = False) -> ImageLike:
        """Inspect ``image`` with the current inspector (late binding: the reconciler always
        uses the inspector of the config in force)."""
        result: ImageLike = await self.current().inspect(image, credentials,
                                                         pull_always=pull_always)
        return result

    def stats(self) -> Any:
        """The current inspector's ``stats`` (None when there is none yet): the metrics'
        source."""
        inspector = self._inspector
        return getattr(inspector, "stats", None) if inspector is not None else None

    async def aclose(self) -> None:
        """Close the inspector built here (never one passed in); errors are ignored."""
        if self._own and self._inspector is not None:
            with contextlib.suppress(Exception):
                await self._inspector.aclose()
