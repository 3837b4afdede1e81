"""Session-wide pytest configuration: the harness fixtures (real registry, localkube or a
real control plane, TLS material) are plugins under ``tests/harness``."""

pytest_plugins = [
    "tests.harness.registry_fixtures",
    "tests.harness.kube_fixtures",
]
