"""Where the recorded kube-apiserver v1.36 exchanges live.

The ground truth is ``shared/reference/`` beside the checkout (the development workspace and
CI have it). A copy is kept in ``tests/reference/`` so a fresh clone alone can run the suite;
``PODPLACEMENT_REFERENCE_DIR`` overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def reference_dir() -> Path:
    """The directory of recorded exchanges: the env override, else ``../shared/reference``
    when present, else the copy in ``tests/reference``."""
    override = os.environ.get("PODPLACEMENT_REFERENCE_DIR")
    if override:
        return Path(override)
    shared = REPO.parent / "shared" / "reference"
    return shared if shared.is_dir() else REPO / "tests" / "reference"


REFERENCE = reference_dir()
