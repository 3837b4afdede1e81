"""``python -m podplacement`` runs the console script."""

from podplacement.cli import main

raise SystemExit(main())
