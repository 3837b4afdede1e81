"""The controller's pure core: placement rules, the config model, NUMA fit and score,
the admission objects as data. Plain Kubernetes dicts and frozen dataclasses in and out,
no I/O; the I/O modules one level up (``podplacement.controller``) import these, never
the reverse (the ``layers`` contract in ``.importlinter``)."""
