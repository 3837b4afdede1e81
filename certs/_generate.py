"""Key and X.509 certificate generation with ``cryptography``: a self-signed CA, serving
certificates and client certificates signed by it (RFC 5280 profile as used for Kubernetes
webhook serving certs and x509 client authentication)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded (bytes)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        """The parsed certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> PrivateKey:
        """The parsed private key (ECDSA or RSA)."""
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise TypeError(f"unsupported key type {type(key).__name__}")
        return key


def new_private_key(key_type: str = "ecdsa") -> PrivateKey:
    """Return a new private key: ``ecdsa`` (P-256, the default) or ``rsa`` (2048 bits).

    Raises:
        ValueError: unknown key type.
    """
    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r} (want 'ecdsa' or 'rsa')")


def _pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def generate_ca(
    common_name: str = "podplacement-ca",
    validity: dt.timedelta = dt.timedelta(days=365),
    key_type: str = "ecdsa",
    not_before: dt.datetime | None = None,
) -> KeyPair:
    """Create a self-signed CA certificate (basicConstraints CA:true, pathlen 0).

    ``not_before`` defaults to one minute ago (clock skew); validity counts from it.
    """
    key = new_private_key(key_type)
    start = not_before or _now() - dt.timedelta(minutes=1)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue_serving_cert(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    validity: dt.timedelta = dt.timedelta(days=90),
    key_type: str = "ecdsa",
    not_before: dt.datetime | None = None,
) -> KeyPair:
    """Issue a TLS server certificate signed by ``ca`` for the given SANs.

    The subject CN is the first DNS name (or the first IP). Raises:
        ValueError: no SAN given, or an IP address does not parse.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    key = new_private_key(key_type)
    ca_cert = ca.certificate
    ca_key = ca.private_key()
    start = not_before or _now() - dt.timedelta(minutes=1)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    cn = dns_names[0] if dns_names else ip_addresses[0]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue_client_cert(
    ca: KeyPair,
    common_name: str,
    organizations: Sequence[str] = (),
    validity: dt.timedelta = dt.timedelta(days=90),
    key_type: str = "ecdsa",
) -> KeyPair:
    """Issue a TLS client certificate signed by ``ca``: subject ``CN=common_name`` with one
    ``O=`` per organization (Kubernetes reads the CN as the user name and each O as a group:
    the x509 client-certificate authenticator), extended key usage clientAuth.

    Raises:
        ValueError: an empty ``common_name``.
    """
    if not common_name:
        raise ValueError("a client certificate needs a common name")
    key = new_private_key(key_type)
    ca_key = ca.private_key()
    start = _now() - dt.timedelta(minutes=1)
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The DNS names a Kubernetes Service answers to: ``svc``, ``svc.ns``, ``svc.ns.svc``,
    ``svc.ns.svc.cluster.local``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
