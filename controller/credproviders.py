"""Kubelet image credential providers in the controller: loading them, and the credentials
they give for a pod's images.

The controller runs the same provider plugins the kubelet runs, from the
``CredentialProviderConfig`` the operator mounts (``--image-credential-provider-config``,
``--image-credential-provider-bin-dir``, the kubelet's flag names), with the kubelet's rules
(:mod:`imageinspect._credproviders`, :mod:`imageinspect._provider_exec`). The webhook never
runs them: it inspects anonymously only (docs/security.md).

The kubelet puts a pod's pull-secret credentials before the providers' in one keyring
(``pkg/credentialprovider/secrets/secrets.go`` ``MakeDockerKeyring``: a union of the secrets'
keyring, then the default keyring of the providers); :func:`pod_credentials` keeps that
order. Provider credentials make the reconciler treat the pod's results as not anonymous, so
they never reach the catalog (:meth:`controller.reconciler.Reconciler.reconcile` publishes
only results learned without any credential); the inspector's result cache is keyed by the
credentials' identities, so a pod without them never reuses a result obtained with them.

ServiceAccount-token mode (KEP-4412, ``tokenAttributes``): the pod's ServiceAccount is read
(uid, annotations) and a token with the configured audience, bound to the pod, is requested
(TokenRequest, ``POST .../serviceaccounts/{name}/token``); each cache key holds the
namespace, ServiceAccount and its uid, so those credentials serve no other ServiceAccount and
no other namespace. Its grants are in the ``credential-providers`` overlay and the chart's
``credentialProviders.serviceAccountTokens`` only (:data:`API_REQUESTS`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from podplacement.imageinspect import (
    Credential,
    InvalidReference,
    PodIdentity,
    ProviderConfigError,
    ProviderRunner,
    parse_reference,
)
from podplacement.kubeclient import KubeAPI
from podplacement.kubeclient.paths import resource_path
from podplacement.rules.place.placement import unique_images

log = logging.getLogger(__name__)

#: The requests of ServiceAccount-token mode (granted only where it is enabled).
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", "/api/v1/namespaces/{namespace}/serviceaccounts/{name}"),
    ("POST", "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
)


class ApiServiceAccounts:
    """:class:`imageinspect.ServiceAccountSource` over the Kubernetes API.

    Args:
        api: the client (``request``).
    """

    def __init__(self, api: KubeAPI) -> None:
        self.api = api

    async def account(self, namespace: str, name: str) -> tuple[str, Mapping[str, str]]:
        """The ServiceAccount's uid and annotations.

        Raises:
            ApiError: it cannot be read; InvalidPathSegment: a name that cannot be one.
        """
        sa = await self.api.request("GET", resource_path(
            "", "v1", "serviceaccounts", namespace=namespace, name=name))
        meta = sa.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return str(meta.get("uid") or ""), {
            str(k): str(v) for k, v in annotations.items()} if isinstance(
                annotations, Mapping) else {}

    async def token(self, pod: PodIdentity, audience: str) -> str:
        """A token of the pod's ServiceAccount for ``audience``, bound to the pod (the
        kubelet's request: default expiry, ``boundObjectRef`` the Pod).

        Raises:
            ApiError: refused; InvalidPathSegment: a name that cannot be one.
        """
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [audience], "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}}}
        answer = await self.api.request("POST", resource_path(
            "", "v1", "serviceaccounts", namespace=pod.namespace, name=pod.service_account,
            subresource="token"), body=body)
        token = (answer.get("status") or {}).get("token")
        if not isinstance(token, str) or not token:
            raise ProviderConfigError("the TokenRequest answer holds no token")
        return token


def load_runner(config_path: str | None, bin_dir: str | None, api: KubeAPI | None,
                on_run: Any = None) -> tuple[ProviderRunner | None, str | None]:
    """The runner of ``--image-credential-provider-config`` (None without the flag) and the
    reason it is unusable (None when fine). An unusable config is logged in one line and the
    controller runs without providers (pull secrets and anonymous access as before)."""
    if not config_path:
        return None, None
    if not bin_dir:
        error = "--image-credential-provider-config needs --image-credential-provider-bin-dir"
    else:
        try:
            runner = ProviderRunner.from_files(
                config_path, bin_dir, accounts=ApiServiceAccounts(api) if api else None,
                on_run=on_run)
        except ProviderConfigError as exc:
            error = str(exc)
        else:
            log.info("credential providers: %s", ", ".join(p.name for p in runner.providers))
            return runner, None
    log.error("credential providers disabled: %s", error)
    return None, error


def pod_identity(pod: Mapping[str, Any]) -> PodIdentity:
    """The pod's namespace, name, uid and ServiceAccount name."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return PodIdentity(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                       str(meta.get("uid") or ""), str(spec.get("serviceAccountName") or ""))


async def provider_credentials(runner: ProviderRunner,
                               pod: Mapping[str, Any]) -> list[Credential]:
    """What the providers give for the pod's images (each image's repository, ``host/path``
    without tag or digest, is what the kubelet passes as ``image``). Images that do not
    parse are left to the inspector (which reports them); never raises for a provider."""
    identity = pod_identity(pod)
    out: list[Credential] = []
    seen: set[tuple[str, str]] = set()
    for image in unique_images(pod):
        try:
            repository = parse_reference(image).name
        except InvalidReference:
            continue
        if not runner.applies(repository):
            continue
        for cred in await runner.credentials(repository, identity):
            if (cred.pattern, cred.identity) not in seen:
                seen.add((cred.pattern, cred.identity))
                out.append(cred)
    return out
