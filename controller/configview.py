"""The PodPlacementConfig as the controller reads it: parsed once per ``resourceVersion``,
defaults when absent or unreadable, and with the exclusions of exec format errors it places
with.

One job: turn the config informer's cached object ``cluster`` into a
:class:`~rules.config.PlacementConfig`. Reads the informer's cache and the
exclusions the exec-format-error monitor holds now (a callable); writes nothing, queues no
key. Never raises: an unreadable config is logged and replaced by the defaults (pods are
still ungated), its parse error returned next to them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from podplacement.kubeclient import Informer
from podplacement.rules.config import (
    CONFIG_NAME,
    ExcludedPlatform,
    PlacementConfig,
    config_or_defaults,
)
from podplacement.rules.learn import merge

log = logging.getLogger(__name__)


class ConfigView:
    """The parsed PodPlacementConfig ``cluster``.

    Args:
        configs: the PodPlacementConfig informer (its cache is read, never written).
        own_excluded: the exclusions this controller's exec-format-error monitor holds in
            force now (empty while this replica does not lead).
    """

    def __init__(self, configs: Informer,
                 own_excluded: Callable[[], Sequence[ExcludedPlatform]]) -> None:
        self._configs = configs
        self._own_excluded = own_excluded
        self._cache: tuple[str, PlacementConfig, str | None] | None = None

    def source(self) -> tuple[PlacementConfig, str | None]:
        """The parsed PodPlacementConfig ``cluster`` (defaults when absent), and the parse
        error when it is unreadable (defaults are used then; pods still get ungated)."""
        obj = self._configs.get(CONFIG_NAME)
        if obj is None:
            return PlacementConfig(), None
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if self._cache is not None and self._cache[0] == rv:
            return self._cache[1], self._cache[2]
        parsed, error = config_or_defaults(obj)
        if error is not None:
            log.warning("PodPlacementConfig %s unreadable, using defaults: %s", CONFIG_NAME,
                        error)
        self._cache = (rv, parsed, error)
        return parsed, error

    def placement(self) -> tuple[PlacementConfig, str | None]:
        """:meth:`source` with the exclusions this controller places with: those its
        exec-format-error monitor holds in force now (fresher than the status it publishes
        them in), then those of the config's status still in force
        (:func:`rules.learn.merge`); none unless ``execFormatErrorMonitor`` has both
        ``enabled`` and ``learn``."""
        config, error = self.source()
        if not (config.exec_format_monitor and config.exec_format_learn):
            return config, error
        own = tuple(self._own_excluded())
        if not own and not config.excluded:
            return config, error
        return replace(config, excluded=merge(own, config.excluded, now=time.time())), error
