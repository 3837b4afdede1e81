"""The admission objects as data: the predicate table (:mod:`.predicates`), the
ValidatingAdmissionPolicy and its binding (:mod:`.admissionpolicy`), the policy's params
(:mod:`.imageparams`) and the webhook configuration (:mod:`.webhookconfig`). Imports
:mod:`rules.place` and the vocabulary, never :mod:`rules.monitor` (the ``rules-rooms``
contract)."""
