"""imageinspect: which platforms (os, architecture, variant) can run a container image?

An OCI distribution client for the controller and ``podplacement inspect``: the distribution
reference grammar with the kubelet's normalisation, pull-secret and docker-config credentials
matched with the kubelet's rules, Basic and Bearer token authentication, registries.conf v2
(mirrors, blocked, insecure), manifests → platforms without fetching index children, a
TTL/LRU/single-flight cache keyed by credential identity, and an address guard (refused
networks, by default link-local and the clouds' metadata addresses) that token realms and
redirects pass too; errors hold no text of the remote side.

Entry point::

    async with Inspector() as inspector:
        info = await inspector.inspect("nginx", credentials_from_pull_secrets(secrets))
        [str(p) for p in info.platforms]   # ["linux/amd64", "linux/arm64/v8", ...]
        report = await verify_image(inspector, "nginx")   # the program's ELF machine
        report.mismatched                                 # platforms it cannot run on
"""

from podplacement.imageinspect._credentials import (
    Credential,
    credentials_from_docker_config,
    credentials_from_pull_secrets,
    match_credentials,
)
from podplacement.imageinspect._credproviders import (
    CredentialProvider,
    ProviderConfigError,
    ProviderResponseError,
    TokenAttributes,
    load_provider_config,
    parse_provider_config,
)
from podplacement.imageinspect._errors import (
    Blocked,
    ConnectionFailed,
    CredentialError,
    Denied,
    DigestMismatch,
    InvalidManifest,
    InvalidReference,
    NotFound,
    RateLimited,
    RefusedTarget,
    RegistriesConfigError,
    RegistryError,
    ServerError,
    Timeout,
    TooLarge,
    Unauthorized,
    UnsafeAddress,
)
from podplacement.imageinspect._inspector import Inspector, InspectorStats
from podplacement.imageinspect._manifest import (
    MAX_INDEX_ENTRIES,
    MAX_MANIFEST_BYTES,
    OS_VERSION_RE,
    ImageInfo,
    Platform,
    estimated_bytes,
)
from podplacement.imageinspect._provider_exec import (
    PluginError,
    PodIdentity,
    ProviderRunner,
    ServiceAccountSource,
)
from podplacement.imageinspect._pullsecrets import PullSecretReader, SecretPath, SecretRequester
from podplacement.imageinspect._reference import Reference, parse_reference
from podplacement.imageinspect._registries import Mirror, RegistriesConfig, RegistryEntry
from podplacement.imageinspect._rootfs import FileVerdict
from podplacement.imageinspect._transport import (
    DEFAULT_REFUSED_NETWORKS,
    MAX_REFUSED_NETWORKS,
    IPNetwork,
    parse_networks,
)
from podplacement.imageinspect._verify import (
    DEFAULT_MAX_BYTES,
    PlatformReport,
    VerifyReport,
    verify_image,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REFUSED_NETWORKS",
    "MAX_INDEX_ENTRIES",
    "MAX_MANIFEST_BYTES",
    "MAX_REFUSED_NETWORKS",
    "OS_VERSION_RE",
    "Blocked",
    "ConnectionFailed",
    "Credential",
    "CredentialError",
    "CredentialProvider",
    "Denied",
    "DigestMismatch",
    "FileVerdict",
    "IPNetwork",
    "ImageInfo",
    "Inspector",
    "InspectorStats",
    "InvalidManifest",
    "InvalidReference",
    "Mirror",
    "NotFound",
    "Platform",
    "PlatformReport",
    "PluginError",
    "PodIdentity",
    "ProviderConfigError",
    "ProviderResponseError",
    "ProviderRunner",
    "PullSecretReader",
    "RateLimited",
    "Reference",
    "RefusedTarget",
    "RegistriesConfig",
    "RegistriesConfigError",
    "RegistryEntry",
    "RegistryError",
    "SecretPath",
    "SecretRequester",
    "ServerError",
    "ServiceAccountSource",
    "Timeout",
    "TokenAttributes",
    "TooLarge",
    "Unauthorized",
    "UnsafeAddress",
    "VerifyReport",
    "credentials_from_docker_config",
    "credentials_from_pull_secrets",
    "estimated_bytes",
    "load_provider_config",
    "match_credentials",
    "parse_networks",
    "parse_provider_config",
    "parse_reference",
    "verify_image",
]
