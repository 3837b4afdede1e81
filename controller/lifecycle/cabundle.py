"""Where the CA bundle of the webhook configuration comes from.

Sources: bytes, a callable returning bytes (sync or async) such as :func:`ca_bundle_from_dir`
(``certs.load_bundle``) or :class:`ServingCertSecret` (the built-in flow used by ``deploy/``,
:mod:`certs.secretflow`: the leader keeps a CA in one Secret and the webhook's serving
certificate in another, which the webhook pods mount, and renews the CA in two steps with an
overlap window, see :mod:`certs.rotation`), or ``None`` with ``cert_manager_certificate`` set
(cert-manager's CA injector owns ``caBundle``; :class:`controller.lifecycle.Lifecycle` adds its
``cert-manager.io/inject-ca-from`` annotation and never touches ``caBundle``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from podplacement import certs
from podplacement.certs import secretflow

# The certificate Secrets' names, where the deploy tests and the rotation tests look for them.
from podplacement.certs.secretflow import CA_SECRET_NAME as CA_SECRET_NAME
from podplacement.certs.secretflow import TLS_SECRET_NAME as TLS_SECRET_NAME
from podplacement.certs.secretflow import WEBHOOK_SERVICE_NAME as WEBHOOK_SERVICE_NAME
from podplacement.controller.lifecycle.paths import WEBHOOK_PATH
from podplacement.kubeclient import resource_path

CaBundleSource = Callable[[], bytes | Awaitable[bytes]]


def ca_bundle_from_dir(cert_dir: str) -> CaBundleSource:
    """A CA bundle source reading ``certs.load_bundle(cert_dir)`` (every CA currently trusted,
    PEM) on each call, so a rotated bundle reaches the webhook configuration on the next
    resync. Raises on call whatever ``certs.load_bundle`` raises (e.g. OSError)."""

    def load() -> bytes:
        return certs.load_bundle(cert_dir)

    return load


async def read_ca_bundle(source: bytes | CaBundleSource | None) -> bytes | None:
    """The PEM CA bundle of ``source`` (bytes and None as they are; a callable is called, and
    awaited when it returns an awaitable).

    Raises:
        ValueError: the callable returned no certificate.
        Exception: whatever the callable raised.
    """
    if source is None or isinstance(source, bytes):
        return source
    value = source()
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, bytes) or not value.strip():
        raise ValueError("the CA bundle source returned no certificate")
    return value


class ServingCertSecret(secretflow.ServingCertSecret):
    """:class:`certs.secretflow.ServingCertSecret` (the built-in certificate flow, same
    arguments) holding a serving-certificate reissue until the caBundle published in our
    MutatingWebhookConfiguration :data:`WEBHOOK_PATH` trusts the signing CA."""

    webhook_configuration_path = WEBHOOK_PATH

    def _path(self, name: str | None = None) -> str:
        """The Secret ``name`` (or the collection) in :attr:`namespace`, from checked
        segments (:func:`kubeclient.resource_path`).

        Raises:
            InvalidPathSegment: the namespace or the name is not an acceptable segment.
        """
        return resource_path("", "v1", "secrets", namespace=self.namespace, name=name or None)
