"""The podplacement controller: gated-pod reconciler, placement decision, affinity merge,
NUMA fit and score, PodPlacementConfig lifecycle and leader election.

Kept import-light: the webhook imports :mod:`rules.config` and must not pull in the
Kubernetes client through this package's ``__init__``.
"""
