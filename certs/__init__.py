"""CA and serving-certificate generation and rotation for the podplacement webhook."""

from certs._generate import (
    KeyPair,
    generate_ca,
    issue_serving_cert,
    new_private_key,
    service_dns_names,
)

__all__ = ["KeyPair", "generate_ca", "issue_serving_cert", "new_private_key", "service_dns_names"]
