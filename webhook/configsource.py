"""Where the webhook gets the PodPlacementConfig ``cluster`` from, without an API call per request.

:class:`WatchingConfigSource` keeps a :class:`kubeclient.Informer` on the singleton
(``fieldSelector=metadata.name=cluster``): a list, then a watch from the list's
resourceVersion (with bookmarks, so the resume point stays fresh); a watch that ends is
resumed from the last resourceVersion seen, a ``410 Gone`` (as an HTTP status or as an
``ERROR`` event, see ``reference/watch-too-old-resource-version.json``) triggers a relist, and
any other failure a bounded exponential backoff. The parsed
:class:`~rules.config.PlacementConfig` (None while the object does not exist) is cached in
memory and read by every admission request. :class:`NamedObjectWatch` is the same watch
for any one named object (the controller's Lease, :mod:`webhook.leasewatch`).
:class:`StaticConfigSource` serves a fixed config (``--config-file``) for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from podplacement.kubeclient import Informer, KubeAPI, resource_path
from podplacement.rules.config import (
    CONFIG_KIND,
    CONFIG_NAME,
    CONFIG_PLURAL,
    GROUP,
    VERSION,
    ConfigError,
    PlacementConfig,
)

log = logging.getLogger(__name__)

CONFIG_LIST_PATH = resource_path(GROUP, VERSION, CONFIG_PLURAL)


class ConfigSource(Protocol):
    """What the admission handler needs: the cached config and whether it was read once."""

    @property
    def current(self) -> PlacementConfig | None:
        """The parsed config, or None when the PodPlacementConfig ``cluster`` does not exist."""
        ...

    @property
    def synced(self) -> bool:
        """True once the config was read (found or not) at least once."""
        ...

    async def start(self) -> None:
        """Begin keeping :attr:`current` up to date (returns at once)."""
        ...

    async def stop(self) -> None:
        """Stop background work started by :meth:`start`."""
        ...


def parse_config_object(obj: Any) -> PlacementConfig | None:
    """Turn a PodPlacementConfig dict (or None/absent) into a :class:`PlacementConfig`.

    Raises:
        ConfigError: the object is not a PodPlacementConfig or a field is unusable.
    """
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise ConfigError("<root>", "a PodPlacementConfig must be an object")
    kind = obj.get("kind", CONFIG_KIND)
    if kind != CONFIG_KIND:
        raise ConfigError("kind", f"expected {CONFIG_KIND}, got {kind!r}")
    return PlacementConfig.from_object(obj)


class StaticConfigSource:
    """A fixed config (or None), synced from the start. Used by ``--config-file``, tests and
    benchmarks."""

    def __init__(self, config: PlacementConfig | None) -> None:
        self._config = config

    @classmethod
    def from_file(cls, path: str | Path) -> StaticConfigSource:
        """Read a PodPlacementConfig object from a YAML or JSON file; an empty file (or
        ``null``) means "no config".

        Raises:
            OSError: the file cannot be read.
            yaml.YAMLError: the file is not YAML.
            ConfigError: the object is not a usable PodPlacementConfig.
        """
        data = yaml.safe_load(Path(path).read_text())
        return cls(parse_config_object(data))

    @property
    def current(self) -> PlacementConfig | None:
        """The fixed config."""
        return self._config

    @property
    def synced(self) -> bool:
        """Always True."""
        return True

    def set(self, config: PlacementConfig | None) -> None:
        """Replace the config (tests)."""
        self._config = config

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""


class NamedObjectWatch:
    """An informer on the one object ``name`` of the collection ``list_path``
    (``fieldSelector=metadata.name=NAME``) that hands each new state to :meth:`_apply`: the
    object when it is added or changes, None when it is deleted (or its resource is not
    served: an absent CRD is looked for again with backoff). Subclasses keep what they need.

    Args:
        api: the API client (its credentials refresh themselves); not closed by
            :meth:`stop` (its owner closes it).
        list_path: the collection, e.g. ``/apis/podplacement.io/v1beta1/podplacementconfigs``
            or ``/apis/coordination.k8s.io/v1/namespaces/NS/leases``.
        name: the object's name.
        backoff_initial / backoff_max: seconds between retries after a failure (doubling,
            with jitter, capped; at most 1 s while the API server is unavailable).
        watch_timeout: ``timeoutSeconds`` asked of each watch call (the server closes it then
            and the watch resumes from the last resourceVersion).
    """

    def __init__(self, api: KubeAPI, list_path: str, name: str, *,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 watch_timeout: int = 300) -> None:
        self.informer = Informer(api, list_path, {"fieldSelector": f"metadata.name={name}"},
                                 name=name, watch_timeout=watch_timeout,
                                 min_backoff=backoff_initial, max_backoff=backoff_max,
                                 tolerate_absent=True)

        def handle(etype: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
            self._apply(None if etype == "DELETED" else obj)

        self.informer.add_handler(handle)

    def _apply(self, obj: Mapping[str, Any] | None) -> None:
        """Take the object's new state (None: it does not exist); must not block."""
        raise NotImplementedError

    @property
    def synced(self) -> bool:
        """True once one list succeeded (or found the resource absent)."""
        return self.informer.synced.is_set()

    @property
    def lists(self) -> int:
        """Successful list calls so far (observability and tests)."""
        return self.informer.lists

    async def wait_synced(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the first list; returns :attr:`synced`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.informer.synced.wait(), seconds)
        return self.synced

    async def start(self) -> None:
        """Start the list+watch loop in a background task (returns at once)."""
        self.informer.start()

    async def stop(self) -> None:
        """Stop the loop (the API client stays open)."""
        await self.informer.stop()


class WatchingConfigSource(NamedObjectWatch):
    """Watches the PodPlacementConfig ``cluster`` and caches the parsed config
    (:class:`NamedObjectWatch` with ``CONFIG_LIST_PATH`` and ``CONFIG_NAME``). A config
    that does not parse is logged and the last good one kept.

    Args:
        api: the API client; not closed by :meth:`stop` (its owner closes it).
        backoff_initial / backoff_max / watch_timeout: as :class:`NamedObjectWatch`
            takes them.
    """

    def __init__(
        self,
        api: KubeAPI,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        watch_timeout: int = 300,
    ) -> None:
        self._config: PlacementConfig | None = None
        super().__init__(api, CONFIG_LIST_PATH, CONFIG_NAME, backoff_initial=backoff_initial,
                         backoff_max=backoff_max, watch_timeout=watch_timeout)

    @property
    def current(self) -> PlacementConfig | None:
        """The cached config (None while the object does not exist)."""
        return self._config

    def _apply(self, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            self._config = None
            return
        try:
            self._config = parse_config_object(obj)
        except ConfigError as exc:
            # Keep the last good config: CRD validation should make this unreachable.
            log.warning("ignoring unusable PodPlacementConfig: %s", exc)
