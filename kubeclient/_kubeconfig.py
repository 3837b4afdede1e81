"""The one typed seam over the ``kubernetes`` package's untyped configuration loaders.

The ``kubernetes`` client ships no type information; its loaders are called here, and only
here, with the types they are documented to take and return, so every other module stays
checked by ``mypy --strict``.
"""

from __future__ import annotations

from typing import Any


def load_incluster(configuration: Any) -> None:
    """Fill ``configuration`` (a ``kubernetes.aio.client.Configuration``) from the pod's
    ServiceAccount (token file, CA, ``KUBERNETES_SERVICE_HOST``).

    Raises:
        kubernetes.config.ConfigException: not running in a pod.
    """
    from kubernetes.aio import config as kconfig

    kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]


async def load_kubeconfig(path: str, context: str | None, configuration: Any) -> Any:
    """Fill ``configuration`` from the kubeconfig file ``path`` (``context``, default the
    current one); returns the library's loader (it refreshes exec-plugin credentials).

    Raises:
        kubernetes.config.ConfigException: unreadable file, unknown context, failing exec
            plugin.
    """
    from kubernetes.aio import config as kconfig

    return await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=path, context=context, client_configuration=configuration,
        persist_config=False)


def kubeconfig_contexts(path: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(contexts, current)`` of the kubeconfig ``path`` (None: the default locations),
    as the library's ``list_kube_config_contexts`` returns them.

    Raises:
        kubernetes.config.ConfigException: no kubeconfig or no contexts; OSError,
            yaml.YAMLError on unreadable files.
    """
    from kubernetes import config as kconfig

    contexts, current = kconfig.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=path)
    return list(contexts or []), dict(current or {})
