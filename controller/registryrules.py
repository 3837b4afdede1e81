"""The registry rules of ``spec.imageInspection.registriesConfigMapRef``, kept fresh.

One job: read the ConfigMap the config names (key ``registries.conf``) when the config changes
and every ``refresh_seconds``, keeping the last good rules
(:class:`controller.registriessource.RegistriesConfigMap`). Reads the config (a callable) and
the ConfigMap (a plain GET); writes nothing to the API server and queues no key: the
inspector (:class:`controller.inspectors.InspectorSource`) picks the rules up by their digest.
Its loop :meth:`RegistryRules.run` is the runnable ``registries configmap`` of every replica
(docs/design.md, "Runnables"). Errors: a missing or malformed ConfigMap, or a failed read, is
logged into :attr:`RegistryRules.error` and the last good rules stay (pods are never held back
for it); nothing here raises.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from podplacement.controller.registriessource import LoadedRegistries, RegistriesConfigMap
from podplacement.kubeclient import KubeAPI
from podplacement.rules.config import PlacementConfig


class RegistryRules:
    """The registries ConfigMap as last read, and the loop that reads it.

    Args:
        api: the Kubernetes client (GET of the ConfigMap).
        config_source: the current (config, parse error) pair.
        config_synced: set once the config informer has listed (the first read waits for it,
            at most one period).
        refresh_seconds: the period of the re-read (at least 0.05 s).
    """

    def __init__(self, api: KubeAPI,
                 config_source: Callable[[], tuple[PlacementConfig, str | None]],
                 config_synced: asyncio.Event, refresh_seconds: float) -> None:
        self._api = api
        self._config_source = config_source
        self._config_synced = config_synced
        self._period = refresh_seconds
        self._map = RegistriesConfigMap()
        self._changed = asyncio.Event()
        #: Set after the first read (a new leader waits a moment for it).
        self.ready = asyncio.Event()

    async def refresh(self) -> None:
        """Read the registries ConfigMap of ``spec.imageInspection.registriesConfigMapRef``
        once (:meth:`controller.registriessource.RegistriesConfigMap.refresh`)."""
        ref = self._config_source()[0].image_inspection.registries_config_map
        await self._map.refresh(self._api, ref)

    @property
    def loaded(self) -> LoadedRegistries | None:
        """The registry rules last read from the ConfigMap (None: none in use)."""
        return self._map.loaded

    @property
    def error(self) -> str | None:
        """Why the last read of the registries ConfigMap failed (None: it did not)."""
        return self._map.error

    def config_changed(self) -> None:
        """The config changed: read the ConfigMap again now."""
        self._changed.set()

    async def run(self) -> None:
        """Re-read the registries ConfigMap when the config changes and every
        ``refresh_seconds``; runs until cancelled."""
        period = max(0.05, self._period)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._config_synced.wait(), period)
        while True:
            self._changed.clear()
            await self.refresh()
            self.ready.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), period)
