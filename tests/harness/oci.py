"""Re-export of :mod:`podplacement.sandbox.oci` (the OCI pusher moved there so the demo does
not import ``tests``); kept so the tests' ``from tests.harness.oci import ...`` work."""

from __future__ import annotations

from podplacement.sandbox import oci as _oci
from podplacement.sandbox.oci import *  # noqa: F403

__all__ = list(_oci.__all__)
