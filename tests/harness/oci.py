"""Re-export of :mod:`podplacement.sandbox.oci` (the OCI pusher moved there so the demo does
not import ``tests``); kept so the tests' ``from tests.harness.oci import ...`` work."""

from __future__ import annotations

from podplacement.sandbox.oci import (
    ATTESTATION_REF_DIGEST,
    ATTESTATION_REF_TYPE,
    DOCKER_CONFIG,
    DOCKER_LAYER_GZIP,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    IN_TOTO,
    MANIFEST_ACCEPT,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    WINDOWS_OS_VERSION,
    Pushed,
    Pusher,
    PushError,
    RegistryAuth,
    layer_tar,
    parse_challenge,
    parse_platform,
    sha256_digest,
)

__all__ = [
    "ATTESTATION_REF_DIGEST",
    "ATTESTATION_REF_TYPE",
    "DOCKER_CONFIG",
    "DOCKER_LAYER_GZIP",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "IN_TOTO",
    "MANIFEST_ACCEPT",
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_LAYER_GZIP",
    "OCI_MANIFEST",
    "WINDOWS_OS_VERSION",
    "PushError",
    "Pushed",
    "Pusher",
    "RegistryAuth",
    "layer_tar",
    "parse_challenge",
    "parse_platform",
    "sha256_digest",
]
