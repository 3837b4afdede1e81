"""The webhook's certificates kept in two Kubernetes Secrets and rotated in place.

:class:`ServingCertSecret` is the built-in certificate flow that ``deploy/`` runs in the
elected controller: a CA in one Secret, the webhook's serving certificate in another (which
the webhook pods mount), renewed with the two-step CA rotation of :mod:`certs.rotation`. It
speaks to the API server through a :class:`Requester`, a structural protocol that the
controller's Kubernetes client satisfies, so this package imports nothing of the controller:
paths and bodies are the Kubernetes JSON API's, errors are told apart by their HTTP
``status``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from podplacement.certs._generate import service_dns_names
from podplacement.certs.rotation import (
    DEFAULT_OVERLAP,
    RotationPlan,
    _issued_by,
    _sans,
    apply_rotation,
    plan_rotation,
)
from podplacement.certs.store import (
    CA_CERT,
    CA_KEY,
    CertState,
    CertStoreError,
    from_secret,
    to_secret,
)

log = logging.getLogger(__name__)

#: Names the ``deploy/`` manifests use (RBAC, the webhook Deployment's volume).
TLS_SECRET_NAME = "podplacement-webhook-tls"
CA_SECRET_NAME = "podplacement-webhook-ca"
WEBHOOK_SERVICE_NAME = "podplacement-webhook"
SECRET_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "podplacement"}
SECRET_TYPE_OPAQUE = "Opaque"

SECRETS_PATH = "/api/v1/namespaces/{namespace}/secrets"
SECRET_PATH = SECRETS_PATH + "/{name}"
#: ``(method, path template)`` of every Secret request :class:`ServingCertSecret` sends (its
#: GET of the webhook configuration is the caller's path, declared by the caller).
API_REQUESTS: tuple[tuple[str, str], ...] = (
    ("GET", SECRET_PATH),
    ("POST", SECRETS_PATH),
    ("PUT", SECRET_PATH),
)

_NOT_FOUND = 404


class Requester(Protocol):
    """What :class:`ServingCertSecret` needs of a Kubernetes API client (the shape of
    ``kubeclient.KubeAPI.request``).

    ``request(method, path, body=...)`` sends one request to the API server: ``method`` an
    HTTP verb (``GET``, ``POST``, ``PUT``), ``path`` an API path such as
    ``/api/v1/namespaces/ns/secrets/name``, ``body`` a JSON-serialisable object (None: no
    body). It returns the decoded JSON answer (a dict). On a non-2xx answer it raises an
    exception carrying the HTTP status as an ``int`` attribute ``status`` (404: the object does
    not exist; 409: a write lost a race); any other exception is passed through unchanged.
    """

    async def request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        """Send one request; return the decoded JSON; raise an error with ``.status``."""
        ...


def _not_found(exc: BaseException) -> bool:
    """True when ``exc`` is a :class:`Requester` error for a missing object (status 404)."""
    return getattr(exc, "status", None) == _NOT_FOUND


def _decoded(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """The Secret's ``data`` decoded (undecodable values read as absent)."""
    out: dict[str, bytes] = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        with contextlib.suppress(ValueError, TypeError):
            out[str(key)] = base64.b64decode(value, validate=True)
    return out


def _read_state(secret: Mapping[str, Any] | None) -> CertState:
    """:func:`certs.store.from_secret` of a Secret; missing or unparseable material reads as
    empty, so the rotation plan re-creates it instead of failing every call."""
    if secret is None:
        return CertState(None, None, ())
    try:
        return from_secret(secret)
    except CertStoreError as exc:
        log.warning("ignoring unusable certificate material: %s", exc)
        return CertState(None, None, ())


def _signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """True when the PEM certificate ``cert_pem`` was issued by the PEM CA ``ca_pem``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return False
    return _issued_by(cert, ca)


def _union(*bundles: Sequence[bytes]) -> tuple[bytes, ...]:
    """Distinct CA certificates of all bundles, oldest (notBefore) first."""
    seen: dict[bytes, dt.datetime] = {}
    for bundle in bundles:
        for pem in bundle:
            if pem not in seen:
                seen[pem] = x509.load_pem_x509_certificate(pem).not_valid_before_utc
    return tuple(sorted(seen, key=lambda p: seen[p]))


def _wall_clock() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ServingCertSecret:
    """The built-in certificate flow: the webhook's certificates kept in Secrets and rotated
    with a CA overlap window (:mod:`certs.rotation`).

    ``<ca_secret>`` (``Opaque``; read by the controller only) holds ``ca.key``, the key of
    the signing CA, and ``ca.crt``, the trust bundle (every trusted CA, PEM, oldest first).
    ``<tls_secret>`` (``kubernetes.io/tls``, :func:`certs.to_secret` without the CA key) holds
    ``tls.crt`` / ``tls.key``, the serving certificate for the webhook Service's DNS names
    (:func:`certs.service_dns_names`), and the same bundle as ``ca.crt``. The webhook pods
    mount ``<tls_secret>``; the kubelet refreshes the files and the webhook reloads them.

    Calling the object (async) reads both Secrets, runs :func:`certs.plan_rotation` /
    :func:`certs.apply_rotation`, writes what changed and returns the bundle (PEM) for the
    webhook configuration's ``caBundle``. A CA renewal (signing CA within ``renew_before +
    overlap`` of expiry, or no usable CA key) therefore takes two calls at least ``overlap``
    apart: the first adds the new CA to the bundle and keeps the serving certificate (the
    caller publishes the two-CA bundle); a later one, once ``overlap`` has passed since the
    new CA's notBefore, reissues the serving certificate from the new CA. Webhook replicas
    still serving the old certificate and API servers still holding the old bundle keep
    working throughout. Expired CAs leave the bundle. The serving certificate is also
    reissued when it is within ``renew_before`` of expiry, missing, not issued by a trusted
    CA, or (outside a CA rotation) lacks the Service's DNS names. ``overlap`` must exceed the
    time the caller needs to publish a bundle (the lifecycle's resync period). Should
    publishing fail for longer, a reissue that the caBundle in the MutatingWebhookConfiguration
    at ``webhook_configuration_path`` would not trust waits (the current certificate, which it
    does trust, is kept; a warning is logged and the plan's reasons say so) until the bundle
    is published.

    Crash safety: the CA Secret is written before the TLS Secret, and the trusted set is read
    as the union of both Secrets' ``ca.crt``, so an interrupted write never loses a CA that a
    serving certificate may already use; the next call completes it.

    Args:
        api: a :class:`Requester`; namespace: where both Secrets live.
        service_name / tls_secret / ca_secret: names (defaults: the ``deploy/`` manifests).
        renew_before: ``rotate_before`` of :func:`certs.plan_rotation`.
        ca_validity / cert_validity: lifetimes of new CAs / serving certificates (a serving
            certificate never outlives its CA).
        overlap: time a new CA is trusted before it signs the serving certificate
            (default :data:`certs.rotation.DEFAULT_OVERLAP`).
        clock: returns the current time (timezone-aware); default: the wall clock.
        webhook_configuration_path: API path of the MutatingWebhookConfiguration whose
            ``caBundle`` is the published trust (GET before a reissue); default: the class
            attribute of the same name, and None there: no publication check.

    Attributes:
        last_plan: the :class:`certs.RotationPlan` of the latest call (None before).

    Raises (on call): the :class:`Requester`'s errors from the API server (status 409 when
    another writer raced us; the caller retries), ValueError from
    :func:`certs.apply_rotation`.
    """

    #: See ``webhook_configuration_path`` above; subclasses bind their own.
    webhook_configuration_path: str | None = None

    def __init__(
        self,
        api: Requester,
        namespace: str,
        *,
        service_name: str = WEBHOOK_SERVICE_NAME,
        tls_secret: str = TLS_SECRET_NAME,
        ca_secret: str = CA_SECRET_NAME,
        renew_before: dt.timedelta = dt.timedelta(days=30),
        ca_validity: dt.timedelta = dt.timedelta(days=5 * 365),
        cert_validity: dt.timedelta = dt.timedelta(days=365),
        overlap: dt.timedelta | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        webhook_configuration_path: str | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.service_name = service_name
        self.tls_secret = tls_secret
        self.ca_secret = ca_secret
        self.renew_before = renew_before
        self.ca_validity = ca_validity
        self.cert_validity = cert_validity
        self.overlap = DEFAULT_OVERLAP if overlap is None else overlap
        self.clock = clock or _wall_clock
        if webhook_configuration_path is not None:
            self.webhook_configuration_path = webhook_configuration_path
        self.last_plan: RotationPlan | None = None

    def _path(self, name: str | None = None) -> str:
        """The API path of the Secret ``name`` in :attr:`namespace` (the collection when
        ``name`` is None). Here a template is filled: this package imports no Kubernetes
        client, and the names are the operator's (flags and defaults), never a pod's. The
        controller's subclass (``controller.lifecycle.cabundle.ServingCertSecret``) builds
        it from checked segments (``kubeclient.resource_path``), and ``kubeclient.KubeAPI``
        sends no path that fails its check."""
        if name:
            return SECRET_PATH.format(namespace=self.namespace, name=name)
        return SECRETS_PATH.format(namespace=self.namespace)

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.api.request("GET", path)
        except Exception as exc:
            if _not_found(exc):
                return None
            raise

    async def _write(self, existing: Mapping[str, Any] | None, desired: dict[str, Any]) -> bool:
        """Create ``desired`` or replace ``existing`` (resourceVersion precondition, foreign
        labels and annotations kept) when its type or data differ; return whether written."""
        if existing is not None:
            if (existing.get("type") == desired["type"]
                    and _decoded(existing) == _decoded(desired)):
                return False
            meta = dict(existing.get("metadata") or {})
            for field in ("labels", "annotations"):
                merged = {**(meta.get(field) or {}), **(desired["metadata"].get(field) or {})}
                if merged:
                    meta[field] = merged
            meta.pop("managedFields", None)
            # A Secret's type is immutable: a foreign type makes the PUT fail (422), loudly.
            body = {**desired, "metadata": meta}
            await self.api.request("PUT", self._path(desired["metadata"]["name"]), body=body)
        else:
            await self.api.request("POST", self._path(), body=desired)
        return True

    def _ca_secret_body(self, state: CertState) -> dict[str, Any]:
        data = {CA_CERT: state.bundle()}
        if state.ca_key_pem is not None:
            data[CA_KEY] = state.ca_key_pem
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.ca_secret, "namespace": self.namespace,
                         "labels": dict(SECRET_LABELS)},
            "type": SECRET_TYPE_OPAQUE,
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }

    async def __call__(self) -> bytes:
        """Ensure and rotate the Secrets; return the CA bundle (PEM, oldest CA first).

        Raises:
            Exception: a :class:`Requester` error (with ``.status``) other than a 404 on a
                read; ValueError from :func:`certs.apply_rotation`.
        """
        now = self.clock()
        ca_obj = await self._get(self._path(self.ca_secret))
        tls_obj = await self._get(self._path(self.tls_secret))
        ca_state, tls_state = _read_state(ca_obj), _read_state(tls_obj)
        state = CertState(tls_state.serving, ca_state.ca_key_pem,
                          _union(ca_state.trusted_cas, tls_state.trusted_cas))
        plan = plan_rotation(state, now, rotate_before=self.renew_before, overlap=self.overlap)
        dns_names = service_dns_names(self.service_name, self.namespace)
        if self._wrong_names(state, plan, dns_names):
            plan = RotationPlan(plan.new_ca, True, plan.drop_cas,
                                (*plan.reasons, "Service DNS names changed"), plan.next_check)
        if plan.reissue_serving and await self._must_wait_for_publication(state, plan, now):
            name = (self.webhook_configuration_path or "").rsplit("/", 1)[-1]
            held = ("serving certificate reissue held: the published caBundle of "
                    f"{name} does not trust the signing CA yet")
            log.warning("%s (it keeps the current serving certificate, which it trusts)", held)
            plan = RotationPlan(plan.new_ca, False, plan.drop_cas,
                                (*plan.reasons, held), plan.next_check)
        if not plan.noop:
            log.info("rotating webhook certificates: %s", "; ".join(plan.reasons))
            state = apply_rotation(state, plan, dns_names=dns_names,
                                   ca_validity=self.ca_validity,
                                   validity=self.cert_validity, now=now)
        self.last_plan = plan
        # CA Secret first: a new CA key and the bundle that trusts it are stored before any
        # serving certificate it signs, and before the bundle copy the webhook pods read.
        await self._write(ca_obj, self._ca_secret_body(state))
        await self._write(tls_obj, to_secret(state, self.tls_secret, self.namespace,
                                             include_ca_key=False, labels=SECRET_LABELS))
        return state.bundle()

    async def _must_wait_for_publication(
        self, state: CertState, plan: RotationPlan, now: dt.datetime
    ) -> bool:
        """True when a reissue must wait: the current serving certificate is valid and trusted
        by the caBundle published in the webhook configuration, but the CA that would sign
        its successor is not in that bundle yet (step 2 of a CA rotation after the overlap
        passed without the caller publishing step 1's bundle, e.g. after repeated failures
        to write the webhook configuration). Reissuing then would make every admission call
        fail until the bundle is published. Without a webhook configuration (first install)
        nothing is published to break, and a serving certificate that already fails is
        replaced at once."""
        if plan.new_ca:  # the successor's CA does not exist yet: the current one is broken
            return False
        signer = state.signing_ca()
        serving = state.serving
        if signer is None or serving is None or now >= serving.certificate.not_valid_after_utc:
            return False
        published = await self._published_cas()
        if published is None:
            return False
        trusted_now = any(_signed_by(serving.cert_pem, ca) for ca in published.values())
        return trusted_now and signer.certificate.public_bytes(Encoding.DER) not in published

    async def _published_cas(self) -> dict[bytes, bytes] | None:
        """The CAs present in the caBundle of every webhook of the MutatingWebhookConfiguration
        at ``webhook_configuration_path``, DER -> PEM (DER compares certificates whatever
        their PEM wrapping); None when there is no such path, it does not exist or carries
        no caBundle (nothing published yet)."""
        if self.webhook_configuration_path is None:
            return None
        live = await self._get(self.webhook_configuration_path)
        if live is None:
            return None
        common: dict[bytes, bytes] | None = None
        for hook in live.get("webhooks") or []:
            raw = ((hook or {}).get("clientConfig") or {}).get("caBundle")
            if not raw:
                return None
            try:
                loaded = x509.load_pem_x509_certificates(base64.b64decode(raw))
            except ValueError:  # unreadable: it trusts nothing, and gets overwritten anyway
                return None
            cas = {c.public_bytes(Encoding.DER): c.public_bytes(Encoding.PEM) for c in loaded}
            common = cas if common is None else {k: v for k, v in common.items() if k in cas}
        return common

    @staticmethod
    def _wrong_names(state: CertState, plan: RotationPlan, dns_names: Sequence[str]) -> bool:
        """The serving certificate lacks the Service's names and may be reissued now: it is
        signed by the signing CA (never during a CA overlap window, whose new CA the API
        server may not trust yet) and no CA rotation step is pending."""
        if state.serving is None or plan.new_ca or plan.reissue_serving:
            return False
        signer = state.signing_ca()
        if signer is None or not _signed_by(state.serving.cert_pem, signer.cert_pem):
            return False
        return not set(dns_names) <= set(_sans(state.serving.certificate)[0])
