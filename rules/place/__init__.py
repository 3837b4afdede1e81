"""The decision and its renderings: the placement of one pod as facts
(:mod:`.placement`, :mod:`.affinity`, :mod:`.fallback`), the controller's decision and plan
(:mod:`.decision`, :mod:`.plan`), and the patches that write it (:mod:`.render`,
:mod:`.podpatch`, the webhook's :mod:`.admission`). Imports the vocabulary at ``rules/`` top,
never :mod:`rules.admit` or :mod:`rules.monitor` (the ``rules-rooms`` contract)."""
