"""CA and serving-certificate generation and rotation for the podplacement webhook.

Public surface: key and certificate generation (:mod:`certs._generate`), storage in a
directory or a ``kubernetes.io/tls`` Secret (:mod:`certs.store`), rotation with a CA overlap
window (:mod:`certs.rotation`), :func:`load_bundle` for the MutatingWebhookConfiguration's
``caBundle``, and the built-in flow keeping the certificates in two Secrets
(:class:`ServingCertSecret`, through any client shaped like :class:`Requester`;
:mod:`certs.secretflow`).
"""

from podplacement.certs._generate import (
    KeyPair,
    generate_ca,
    issue_client_cert,
    issue_serving_cert,
    new_private_key,
    service_dns_names,
)
from podplacement.certs.rotation import RotationPlan, apply_rotation, plan_rotation, rotate_dir
from podplacement.certs.secretflow import Requester, ServingCertSecret
from podplacement.certs.store import (
    CertState,
    CertStoreError,
    ca_bundle,
    from_secret,
    load_bundle,
    read_dir,
    to_secret,
    write_dir,
)

__all__ = [
    "CertState",
    "CertStoreError",
    "KeyPair",
    "Requester",
    "RotationPlan",
    "ServingCertSecret",
    "apply_rotation",
    "ca_bundle",
    "from_secret",
    "generate_ca",
    "issue_client_cert",
    "issue_serving_cert",
    "load_bundle",
    "new_private_key",
    "plan_rotation",
    "read_dir",
    "rotate_dir",
    "service_dns_names",
    "to_secret",
    "write_dir",
]
