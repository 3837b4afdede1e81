"""PodPlacementConfig lifecycle: finalizers, the owned admission objects, status conditions,
the ordered uninstall and the last controller's stand-down.

:class:`Lifecycle` reconciles the singleton ``PodPlacementConfig`` ``cluster`` like a
controller-runtime reconciler: read the config, compute what should exist, write only the
difference, and report through ``status.conditions``. It has no loop of its own: it is a
handler of the controller's one :class:`~controller.queue.WorkQueue` (:meth:`Lifecycle.handle`)
for the keys :data:`LIFECYCLE_KEY`, :data:`FINISH_KEY` and :data:`LAST_STOP_KEY` (a pod's key
is ``namespace/name/uid``; these hold no slash). Each pass returns "done" or "again after N
seconds" (:attr:`ReconcileResult.requeue_after`) or raises; the queue owns backoff and the
failure count, which the lifecycle reads where it needs one. It runs in the elected leader
only (:mod:`controller.leader`): the app queues :data:`LIFECYCLE_KEY` on every config watch
event, and each pass asks to run again after ``resync_seconds``, which is how drift of the
webhook configuration (someone edits or deletes it) is reverted: at most ``resync_seconds``
later (longer while the queue backs off after failures).

Rules (docs/guide/uninstall.md; the ownership rules are :mod:`rules.ownership`'s):

* While the config exists (and nothing is being deleted) it carries the finalizer
  ``podplacement.io/finalizer``; the MutatingWebhookConfiguration ``podplacement-webhook``,
  the MutatingAdmissionPolicy and binding ``podplacement-gate`` (owned by the product's
  Namespace) and the params object (in the product's namespace) exist; the controller's own
  ServiceAccount carries the same finalizer and the uninstall ClusterRole and binding exist.
* No config: the webhook configuration and the policy are deleted.
* Upgrades (docs/guide/upgrade.md): what an earlier release left and this one no
  longer uses (:mod:`rules.legacy`: release 0.1.0's cluster-scoped params object
  ``ImagePlatforms cluster`` and its CRD) is deleted by every pass while it is there; a
  binding ``podplacement-gate`` whose ``paramRef`` is not ours (0.1.0's) is deleted before
  our params object is written, then created anew. The status never says the policy is not
  in force while a binding of it may still be there (:data:`POLICY_AS_LEFT`).
* The config, the product's namespace or the controller's ServiceAccount being deleted
  (``kubectl delete -k deploy/`` does all three at once): the ordered uninstall. Status
  ``Deprovisioning=True``; the policy, the params object and the webhook configuration are
  deleted (no new pod gets gated); once ``admission_settle_seconds`` have passed since the
  last deletion (the pass asks to run again after the time still to wait, it never sleeps),
  ``ungate_remaining(deadline_seconds)`` (normal decisions within the deadline, counted from
  the first release attempt, plain ungate after it) releases every pod still gated; then the
  config's finalizer is removed, and when the controller itself is being removed, the
  ServiceAccount's finalizer last. Every step is idempotent, so a pass cut short (a lost
  lease or a stop cancels the queue's work in flight) is simply run again.
* The uninstall runs to its end even when the lease is lost (the namespace's deletion
  deletes the Lease) or the process is asked to stop: the app then serves
  :data:`FINISH_KEY` on a one-worker queue of its own, after the pod workers are gone, until
  the pass says done or :attr:`Lifecycle.final_seconds` pass (:meth:`Lifecycle.finish`).
* Shutdown of one controller (graceful or not) leaves everything in place: it belongs to
  the installed config, not to one process (deleting the webhook configuration on a rolling
  update let pods created during the handover escape the gate). The next leader
  re-processes every pod still gated. But the **last** controller to stop gracefully (no
  other took the lease: the Deployment scaled to 0, its pods evicted with replacements that
  cannot start) stands down (:data:`LAST_STOP_KEY`, :meth:`Lifecycle.last_stop`, served
  the same way once the pod workers have stopped): it deletes the params object, so the API
  server stops gating, releases every gated pod, says so in the status and removes the
  finalizers no live controller would honour.

Status conditions (metav1.Condition, ``observedGeneration`` on each and on ``status``):
``Available`` (webhook configuration in place), ``Progressing`` (a change or an uninstall is
under way, or the last attempt failed and will be retried), ``Degraded`` (invalid config, a
namespaceSelector that the webhook cannot express exactly, no CA bundle, API errors) and
``Deprovisioning`` (ordered uninstall running). ``lastTransitionTime`` changes only when a
condition's status changes; the status is written only when something changed.

CA bundle sources: bytes, a callable returning bytes (sync or async) such as
:func:`ca_bundle_from_dir` (``certs.load_bundle``) or :class:`ServingCertSecret` (the built-in
flow used by ``deploy/``, :mod:`certs.secretflow`: the leader keeps a CA in one Secret and the
webhook's serving certificate in another, which the webhook pods mount, and renews the CA in
two steps with an overlap window, see :mod:`certs.rotation`), or ``None`` with
``cert_manager_certificate`` set (cert-manager's CA injector owns ``caBundle``; we add its
``cert-manager.io/inject-ca-from`` annotation and never touch ``caBundle``).

The package is the coordinator and one module per job (docs/design.md, "The lifecycle's
jobs"):

==========================  ====================  ==============================================
class                       module                owns
==========================  ====================  ==============================================
:class:`Lifecycle`          ``coordinator``       the work-queue keys; reads the config, the
                                                  namespace and the ServiceAccount once per
                                                  pass; picks the job: converge, ordered
                                                  uninstall or stand-down
:class:`Convergence`        ``converge``          the normal pass: the config's finalizer, the
                                                  guards, the admission objects, the leftovers,
                                                  the status
:class:`AdmissionObjects`   ``admissionobjects``  MutatingAdmissionPolicy, binding, params
                                                  object, MutatingWebhookConfiguration
:class:`ConfigStatus`       ``status``            the config's finalizer and ``status`` (and
                                                  every condition text)
:class:`UninstallGuards`    ``guards``            the controller's identity, its
                                                  ServiceAccount's finalizer, the uninstall
                                                  ClusterRole and binding
:class:`PreviousReleases`   ``retirement``        what earlier releases left (CRDs, objects)
:class:`Withdrawal`         ``withdrawal``        the ordered uninstall and the stand-down
==========================  ====================  ==============================================

``paths`` holds the API paths and :data:`API_REQUESTS`, ``objects`` the requests every job
makes the same way (GET-or-absent, create-or-revert-drift, the finalizer patch), ``passes``
the data passed between jobs, ``cabundle`` the CA bundle sources (:func:`ca_bundle_from_dir`,
:class:`ServingCertSecret`).
"""

# Re-exports: the names the controller, the tests, the benchmarks and deploy/'s checks import
# from controller.lifecycle. The jobs' own classes and constants are imported from their
# modules.
from podplacement.controller.lifecycle.admissionobjects import (
    POLICY_ABSENT,
    POLICY_AS_LEFT,
    POLICY_IN_FORCE,
)
from podplacement.controller.lifecycle.cabundle import (
    CA_SECRET_NAME,
    TLS_SECRET_NAME,
    WEBHOOK_SERVICE_NAME,
    ServingCertSecret,
    ca_bundle_from_dir,
)
from podplacement.controller.lifecycle.coordinator import (
    FINAL_ATTEMPTS,
    FINISH_KEY,
    KEYS,
    LAST_STOP_KEY,
    LIFECYCLE_KEY,
    Lifecycle,
)
from podplacement.controller.lifecycle.passes import ReconcileResult
from podplacement.controller.lifecycle.paths import (
    API_REQUESTS,
    BINDING_PATH,
    CONFIG_PATH,
    POLICY_PATH,
    WEBHOOK_PATH,
    retired_crd_path,
    retired_object_path,
)
from podplacement.controller.lifecycle.status import (
    ConditionSpec,
    available_conditions,
    merge_conditions,
)
from podplacement.controller.lifecycle.withdrawal import UngateRemaining

__all__ = [
    "API_REQUESTS",
    "BINDING_PATH",
    "CA_SECRET_NAME",
    "CONFIG_PATH",
    "FINAL_ATTEMPTS",
    "FINISH_KEY",
    "KEYS",
    "LAST_STOP_KEY",
    "LIFECYCLE_KEY",
    "POLICY_ABSENT",
    "POLICY_AS_LEFT",
    "POLICY_IN_FORCE",
    "POLICY_PATH",
    "TLS_SECRET_NAME",
    "WEBHOOK_PATH",
    "WEBHOOK_SERVICE_NAME",
    "ConditionSpec",
    "Lifecycle",
    "ReconcileResult",
    "ServingCertSecret",
    "UngateRemaining",
    "available_conditions",
    "ca_bundle_from_dir",
    "merge_conditions",
    "retired_crd_path",
    "retired_object_path",
]
