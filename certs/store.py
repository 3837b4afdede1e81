"""Storage of the webhook's certificate material: a directory or a ``kubernetes.io/tls`` Secret.

Both hold the same keys (the layout of a mounted ``kubernetes.io/tls`` Secret, which is what
the webhook Deployment mounts): ``tls.crt`` (serving certificate), ``tls.key`` (its key),
``ca.crt`` (the trust bundle: every CA currently trusted, PEM concatenated; this is the
MutatingWebhookConfiguration's ``caBundle``) and ``ca.key`` (the key of the CA that signs new
serving certificates; Kubernetes allows extra keys in a TLS Secret). Directory writes are
atomic per file (temp file in the same directory, fsync, ``os.replace``), and ordered so that a
reader never trusts less than it needs: the bundle is written first, the serving pair last.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podplacement.certs._generate import KeyPair

TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SECRET_TYPE_TLS = "kubernetes.io/tls"


class CertStoreError(Exception):
    """Stored certificate material is missing or does not parse.

    Attributes:
        location: the directory or ``namespace/name`` of the Secret.
    """

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location


def split_pem_certs(data: bytes) -> tuple[bytes, ...]:
    """Split concatenated PEM certificates into one PEM block each (input order kept).

    Raises:
        ValueError: a block does not parse as an X.509 certificate.
    """
    return tuple(c.public_bytes(serialization.Encoding.PEM)
                 for c in x509.load_pem_x509_certificates(data)) if data.strip() else ()


@dataclass(frozen=True, slots=True)
class CertState:
    """All certificate material of the webhook.

    Attributes:
        serving: the serving certificate and key (None before the first issue).
        ca_key_pem: PEM key of the signing CA (None when unknown, e.g. cert-manager issued).
        trusted_cas: the PEM certificates of every trusted CA, oldest first; the signing CA is
            the one whose public key matches ``ca_key_pem``.
    """

    serving: KeyPair | None
    ca_key_pem: bytes | None
    trusted_cas: tuple[bytes, ...] = field(default=())

    def bundle(self) -> bytes:
        """The caBundle: all trusted CA certificates, PEM concatenated."""
        return b"".join(self.trusted_cas)

    def signing_ca(self) -> KeyPair | None:
        """The trusted CA whose key is ``ca_key_pem`` (None when absent)."""
        if self.ca_key_pem is None:
            return None
        key = serialization.load_pem_private_key(self.ca_key_pem, password=None)
        wanted = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for pem in self.trusted_cas:
            cert = x509.load_pem_x509_certificate(pem)
            spki = cert.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            if spki == wanted:
                return KeyPair(pem, self.ca_key_pem)
        return None


def ca_bundle(state: CertState) -> bytes:
    """The caBundle bytes for the MutatingWebhookConfiguration (every trusted CA, PEM)."""
    return state.bundle()


# --- directory ---------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    if _read(path) == data:
        return  # unchanged: keep the inode, so watchers (the webhook's reloader) stay quiet
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_dir(directory: str | Path, state: CertState) -> None:
    """Write ``state`` into ``directory`` (created if needed), one atomic rename per file.

    Order: ``ca.crt`` (so the bundle already trusts a new CA), ``ca.key``, ``tls.key``,
    ``tls.crt``. Files whose content is unchanged are not rewritten. Keys get mode 0600.
    Raises:
        OSError: the directory or a file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _atomic_write(d / CA_CERT, state.bundle(), 0o644)
    if state.ca_key_pem is not None:
        _atomic_write(d / CA_KEY, state.ca_key_pem, 0o600)
    if state.serving is not None:
        _atomic_write(d / TLS_KEY, state.serving.key_pem, 0o600)
        _atomic_write(d / TLS_CERT, state.serving.cert_pem, 0o644)
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def read_dir(directory: str | Path) -> CertState:
    """Read the state written by :func:`write_dir` (or a mounted TLS Secret).

    Missing files give None / an empty bundle. Raises:
        CertStoreError: a certificate file does not parse, or only one of tls.crt/tls.key exists.
    """
    d = Path(directory)
    cert, key = _read(d / TLS_CERT), _read(d / TLS_KEY)
    return _state(str(d), cert, key, _read(d / CA_CERT), _read(d / CA_KEY))


def load_bundle(directory: str | Path) -> bytes:
    """The current caBundle from a certificate directory: every trusted CA, PEM concatenated.

    This is what the controller puts into the MutatingWebhookConfiguration's ``caBundle``.
    Raises:
        CertStoreError: ``ca.crt`` is missing, empty or does not parse.
    """
    data = _read(Path(directory) / CA_CERT)
    if not data or not data.strip():
        raise CertStoreError(str(directory), f"{CA_CERT} is missing or empty")
    try:
        return b"".join(split_pem_certs(data))
    except ValueError as exc:
        raise CertStoreError(str(directory), f"{CA_CERT}: {exc}") from None


def _state(
    location: str,
    cert: bytes | None,
    key: bytes | None,
    ca: bytes | None,
    ca_key: bytes | None,
) -> CertState:
    if (cert is None) != (key is None):
        raise CertStoreError(location, f"{TLS_CERT} and {TLS_KEY} must both be present")
    try:
        cas = split_pem_certs(ca or b"")
        if cert is not None:
            x509.load_pem_x509_certificates(cert)
    except ValueError as exc:
        raise CertStoreError(location, f"certificate does not parse: {exc}") from None
    serving = KeyPair(cert, key) if cert is not None and key is not None else None
    return CertState(serving, ca_key or None, cas)


# --- Secret --------------------------------------------------------------------------------


def to_secret(
    state: CertState,
    name: str,
    namespace: str,
    *,
    include_ca_key: bool = True,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret object (dict, base64 ``data``) holding ``state``.

    Raises:
        ValueError: ``state`` has no serving certificate (a TLS Secret requires both keys).
    """
    if state.serving is None:
        raise ValueError("a kubernetes.io/tls Secret needs tls.crt and tls.key")
    data = {
        TLS_CERT: state.serving.cert_pem,
        TLS_KEY: state.serving.key_pem,
        CA_CERT: state.bundle(),
    }
    if include_ca_key and state.ca_key_pem is not None:
        data[CA_KEY] = state.ca_key_pem
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": SECRET_TYPE_TLS,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def from_secret(secret: Mapping[str, Any]) -> CertState:
    """Read a Secret object (dict as the API returns it; ``data`` base64, ``stringData`` too).

    Raises:
        CertStoreError: a value is not base64, or a certificate does not parse.
    """
    meta = secret.get("metadata") or {}
    location = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    values: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            values[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise CertStoreError(location, f"data[{key!r}] is not base64") from None
    for key, value in (secret.get("stringData") or {}).items():
        values[key] = str(value).encode()
    return _state(location, values.get(TLS_CERT), values.get(TLS_KEY),
                  values.get(CA_CERT), values.get(CA_KEY))
