"""Registry rules from the ConfigMap named by ``spec.imageInspection.registriesConfigMapRef``.

:class:`RegistriesConfigMap` reads the ConfigMap's key ``registries.conf`` (a
containers-registries.conf(5) v2 document) and keeps the last good parsed rules;
:func:`registries_from` combines them with ``--registries-conf`` and ``--insecure-registry``
into the rules of the controller's inspector. The controller (:mod:`controller.app`) calls
:meth:`RegistriesConfigMap.refresh` when the config changes and periodically.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podplacement.kubeclient import KubeAPI, resource_path
from podplacement.rules.config import REGISTRIES_CONF_KEY, ObjectRef

if TYPE_CHECKING:
    from podplacement.imageinspect import RegistriesConfig

log = logging.getLogger(__name__)

CONFIGMAP_PATH = "/api/v1/namespaces/{namespace}/configmaps/{name}"


@dataclass(frozen=True, slots=True)
class LoadedRegistries:
    """Registry rules read from a ConfigMap: its reference, ``resourceVersion``, the SHA-256
    hex digest of its ``registries.conf`` text (part of the inspector's rebuild key) and the
    parsed ``imageinspect.RegistriesConfig``."""

    ref: ObjectRef
    resource_version: str
    digest: str
    registries: RegistriesConfig


class RegistriesConfigMap:
    """The registries ConfigMap as last read.

    Attributes:
        loaded: the last good rules (None: no reference in the config, or never read).
        error: why the last read failed (None after a good read or without a reference).
    """

    def __init__(self) -> None:
        self.loaded: LoadedRegistries | None = None
        self.error: str | None = None

    async def refresh(self, api: KubeAPI, ref: ObjectRef | None) -> None:
        """Read the ConfigMap ``ref`` once (GET ``/api/v1/namespaces/{ns}/configmaps/{name}``,
        key ``registries.conf``).

        ``ref`` None: drops the ConfigMap's rules (``--registries-conf`` applies again). A
        missing ConfigMap, a missing key, invalid TOML or a failed request: logged (once per
        distinct error) into :attr:`error`, and the last good rules stay in use. Never raises
        (except cancellation)."""
        if ref is None:
            if self.loaded is not None:
                log.info("registriesConfigMapRef unset: using --registries-conf again")
            self.loaded = None
            self.error = None
            return
        try:
            self._load(ref, await api.request(
                "GET",
                resource_path("", "v1", "configmaps", namespace=ref.namespace, name=ref.name),
                request_timeout=10.0,
            ))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let a bad ConfigMap stop the controller
            error = f"ConfigMap {ref.namespace}/{ref.name}: {exc}"
            if error != self.error:
                log.warning("registries ConfigMap unusable, keeping the previous registry "
                            "rules: %s", error)
            self.error = error

    def _load(self, ref: ObjectRef, cm: Mapping[str, Any]) -> None:
        from podplacement.imageinspect import RegistriesConfig, RegistriesConfigError

        text = (cm.get("data") or {}).get(REGISTRIES_CONF_KEY)
        if not isinstance(text, str):
            raise RegistriesConfigError(f"no data key {REGISTRIES_CONF_KEY!r}")
        rv = str((cm.get("metadata") or {}).get("resourceVersion") or "")
        digest = hashlib.sha256(text.encode()).hexdigest()
        current = self.loaded
        if current is not None and current.digest == digest:
            parsed = current.registries
        else:
            parsed = RegistriesConfig.from_toml(text)
            log.info("registry rules from ConfigMap %s/%s (resourceVersion %s): %d entries",
                     ref.namespace, ref.name, rv, len(parsed.registries))
        self.loaded = LoadedRegistries(ref, rv, digest, parsed)
        self.error = None


def registries_from(*, config_map: RegistriesConfig | None = None,
                    conf_file: str | None = None,
                    insecure: Iterable[str] = ()) -> RegistriesConfig:
    """The registry rules the controller's inspector uses.

    Precedence: ``config_map`` (a parsed ``imageinspect.RegistriesConfig`` from the ConfigMap
    of ``spec.imageInspection.registriesConfigMapRef``) replaces ``conf_file``
    (``--registries-conf``) entirely; without either, no rules. Every ``insecure`` host
    (``host[:port]``, ``--insecure-registry``) is then marked insecure on top.

    Raises:
        OSError / imageinspect.RegistriesConfigError: ``conf_file`` is read (only when no
            ``config_map``) and is unreadable or invalid.
    """
    from podplacement.imageinspect import RegistriesConfig

    if config_map is not None:
        registries = config_map
    elif conf_file:
        registries = RegistriesConfig.load(conf_file)
    else:
        registries = RegistriesConfig()
    for host in insecure:
        registries = registries.with_insecure(host)
    return registries
