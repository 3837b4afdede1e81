"""pytest fixtures for the real OCI registry (docker-registry) variants."""
