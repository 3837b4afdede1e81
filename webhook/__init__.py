"""The podplacement mutating admission webhook: gate every new pod the controller may place.

Modules: :mod:`webhook.gating` (pure: should this pod be gated, and why not),
:mod:`webhook.patch` (pure: the JSONPatch), :mod:`webhook.app` (the FastAPI app: ``/mutate``,
``/healthz``, ``/readyz``, ``/metrics``), :mod:`webhook.pipeline` (``/mutate``'s stages: decode,
skip, outage, place, gate), :mod:`webhook.review` (the AdmissionReview decoded, the answer
encoded), :mod:`webhook.metrics` (``podplacement_webhook_*``), :mod:`webhook.configsource`
(the cached PodPlacementConfig), :mod:`webhook.leasewatch` (is a controller running?),
:mod:`webhook.placecache` (anonymous inspection results per image, filled in the
background; the webhook reads no Secret),
:mod:`webhook.admitinspect` (anonymous inspection at admission within a budget, one per
image at a time), :mod:`webhook.admitplace` (placing a gated pod at admission: the
cache, else its images inspected or revalidated within the config's budget),
:mod:`webhook.outage` (the answer while no controller runs),
:mod:`webhook.tls` and :mod:`webhook.server` (uvicorn over TLS with certificate reload),
:mod:`webhook.cli` (``podplacement webhook``).

Namespace opt-out (``podplacement.io/exclude-pod-placement`` and the config's
``namespaceSelector``) is not checked here: an AdmissionReview carries no namespace labels, so
the MutatingWebhookConfiguration's ``namespaceSelector`` (kept in sync by the controller) keeps
those pods from reaching the webhook at all.
"""

from podplacement.webhook.gating import GateDecision, should_gate
from podplacement.webhook.patch import gate_patch

__all__ = ["GateDecision", "gate_patch", "should_gate"]
