"""Tests of localkube (the Kubernetes API double)."""
