"""Exec format errors in pod status: the detection rule, the Event and the pod's record.

Pure: a Pod dict in (as the API serves it), findings out; the I/O lives in
:mod:`controller.execformatmonitor`. A container "fails with an exec format error" when the
status the kubelet writes carries the text ``exec format error`` (any case) in
``state.waiting.message``, ``state.terminated.message`` or ``lastState.terminated.message``,
for an app or an init container. The text comes from ``execve`` failing with ENOEXEC: the
kernel refuses an ELF file of another machine (``fs/binfmt_elf.c``), and the runtimes word it
as follows (facts read from their sources):

- runc (``internal/linux/linux.go`` ``Exec``; ``libcontainer/system/linux.go`` ``Exec`` before
  1.3): an ``os.PathError`` with ``Op`` ``exec``, printed as ``exec /bin/sh: exec format
  error`` (Go's text for ENOEXEC). runc runs ``execve`` in ``runc init`` after the exec fifo
  is written (``libcontainer/standard_init_linux.go`` ``Init``), i.e. after ``runc start``
  has returned, so ``libcontainer/init_linux.go`` ``Init`` prints the error on the
  container's stderr and exits 255 (``os.Exit(255)``, runc 1.2 and later; exit 1 in 1.1,
  ``init.go``). runc 1.0 worded it ``standard_init_linux.go:228: exec user process caused:
  exec format error``.
- crun (``src/libcrun/container.c`` ``container_init``): ``exec container process
  `/bin/sh`: Exec format error`` (``crun_make_error`` with errno: ``strerror`` text), also
  after the exec fifo, written to the container's stderr (``log_write_to_stderr``; as JSON
  ``{"msg": "...", "level": "error", ...}`` when crun logs in JSON) and exit status 1
  (``libcrun_fail_with_error``, ``src/libcrun/linux.c``).
- containerd (``internal/cri/server/container_start.go`` ``StartContainer``, constants in
  ``internal/cri/server/helpers.go``): a start that fails leaves the container exited with
  reason ``StartError``, exit code 128 and the error text as message (``failed to start
  containerd task "<id>": ...`` or ``failed to create containerd task: ...``); the kubelet
  shows it as ``lastState.terminated``. An exited container without a reason gets ``Error``
  (non-zero exit) or ``Completed`` (``container_status.go`` ``toCRIContainerStatus``).
- CRI-O (``server/container_start.go`` ``StartContainer``, ``internal/oci/container.go``
  ``SetStartFailed``): a failed ``<runtime> start`` is ``failed to start container <id>:
  <runtime stderr>``; CRI-O removes that container and the kubelet shows the waiting reason
  ``RunContainerError`` with that message (``pkg/kubelet/kuberuntime/kuberuntime_container.go``
  ``startContainer``: ``kubecontainer.ErrRunContainer``, message = the CRI error). An exited
  container gets reason ``Error`` and ``Message`` = its recorded error
  (``server/container_status.go``).
- The kubelet (``kuberuntime_container.go``) appends the tail of the container's log to
  ``terminated.message`` when ``terminationMessagePolicy`` is ``FallbackToLogsOnError`` and
  the exit code is not 0; that is where runc's and crun's stderr lines above reach the status.

Because runc and crun report the failure after ``start`` has returned, their text reaches the
status only through that log tail (or a runtime that reports it at start): with the default
``terminationMessagePolicy: File`` the status shows ``reason: Error``, exit code 255 (runc)
or 1 (crun) and no message, which this rule cannot tell from any other crash.

**Verify on suspicion** closes that gap without reading logs (:func:`suspicion_of`): a
container whose terminated state (current or last) has exactly that shape, reason
``Error``, exit code 255 or 1, an empty message, and ran for at most
:data:`SUSPECT_MAX_RUN_SECONDS` (``finishedAt`` - ``startedAt``; the failure comes within
milliseconds of the start, and the API's timestamps have whole seconds) is a *suspicion*.
The monitor then verifies the image (once per digest, cached), and a verification that finds
the platform of the node's architecture holding a binary for another machine is proof: the
suspicion becomes a finding like any other (:func:`proven_finding`, ``proof``
``verification``). A suspicion whose verification passes, or a crash that ran longer or
said something, is nothing. Sources of the shape: ``containerd`` ``container_status.go``
(reason ``Error`` for a non-zero exit without a reason), the exit codes above, and the
kubelet's ``terminationMessagePolicy`` handling (``kuberuntime_container.go``: ``File``
copies only ``/dev/termination-log``, which a process that never ran did not write).

Observed on a real node (kubelet v1.36.2, containerd 1.6.20, runc 1.1.5: the sandbox's,
``tests/test_realnode_e2e.py``; docs/exec-format-errors.md quotes the statuses): an amd64
image config over an arm64 binary gives ``terminated {exitCode: 1, reason: Error}``, no
message with ``File`` (the current state; after a restart it is ``lastState``, as seen with
``FallbackToLogsOnError``), ``startedAt`` equal
to ``finishedAt``: the suspicion above, which verification proves; with
``FallbackToLogsOnError`` the message is ``exec /bin/sh: exec format error``, a finding.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from podplacement.rules.config import (
    DECISION_ANNOTATION,
    EXEC_FORMAT_ANNOTATION,
    EXEC_FORMAT_LABEL,
    EXEC_FORMAT_REASON,
    LINUX,
)
from podplacement.rules.place.decision import WARNING, EventSpec, pod_images

#: The text every runtime's message carries (Go: "exec format error"; glibc strerror:
#: "Exec format error").
EXEC_FORMAT_TEXT = "exec format error"
#: Exit codes of a runtime's init whose ``execve`` failed after start: runc 1.2 and later
#: (``os.Exit(255)``), runc 1.1 and crun (1).
SUSPECT_EXIT_CODES = frozenset({1, 255})
#: Longest run, ``finishedAt`` - ``startedAt`` in whole seconds, of a suspicion.
SUSPECT_MAX_RUN_SECONDS = 2
#: How a finding was established: the runtime's words in the status, or a suspicion whose
#: verification proved it.
PROOF_MESSAGE = "message"
PROOF_VERIFICATION = "verification"

# The program path in each runtime's wording.
_PATHS = (
    re.compile(r"exec container process `([^`]+)`: exec format error", re.I),  # crun
    re.compile(r'exec: "([^"]+)": exec format error', re.I),  # Go exec.Error
    re.compile(r"exec (/\S+|\S+): exec format error", re.I),  # runc os.PathError
)


def _digest(image_id: str) -> str | None:
    """``sha256:<hex>`` of a status ``imageID`` (``repo@sha256:..``, ``sha256:..``,
    ``docker-pullable://repo@sha256:..``), or None."""
    match = re.search(r"(sha256|sha512):[0-9a-f]{32,128}", image_id or "")
    return match.group(0) if match else None


@dataclass(frozen=True, slots=True)
class ExecFormatFinding:
    """One container status showing an exec format error.

    Attributes:
        container: the container's name.
        init: an init container.
        restart_count: the status's ``restartCount`` (one Event per value).
        image: the status's ``image``.
        image_id: the status's ``imageID`` (what the node runs).
        digest: the ``sha256:`` digest in ``image_id`` (None when it has none).
        field: where the text was: ``state.waiting``, ``state.terminated`` or
            ``lastState.terminated``.
        reason: that state's ``reason`` (``StartError``, ``RunContainerError``, ``Error``).
        exit_code: the terminated state's ``exitCode`` (None for waiting).
        message: that state's ``message``.
        program: the program path named in the message, when it names one.
        proof: :data:`PROOF_MESSAGE` (the runtime's words) or :data:`PROOF_VERIFICATION`
            (a :class:`Suspicion` the verification proved).
        ran_seconds: for a proven suspicion, ``finishedAt`` - ``startedAt``.
    """

    container: str
    init: bool
    restart_count: int
    image: str
    image_id: str
    digest: str | None
    field: str
    reason: str
    exit_code: int | None
    message: str
    program: str | None
    proof: str = PROOF_MESSAGE
    ran_seconds: int | None = None

    @property
    def reference(self) -> str | None:
        """What to verify: the ``imageID`` as ``repo@digest`` when it is one (the content
        the node ran), else the status's image with its digest, else None."""
        ref = self.image_id.removeprefix("docker-pullable://")
        if "@" in ref and self.digest:
            return ref
        return None


def _states(status: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    state = status.get("state") or {}
    last = status.get("lastState") or {}
    for name, obj in (("state.waiting", state.get("waiting")),
                      ("state.terminated", state.get("terminated")),
                      ("lastState.terminated", last.get("terminated"))):
        if isinstance(obj, Mapping):
            yield name, obj


def finding_of(status: Mapping[str, Any], *, init: bool = False) -> ExecFormatFinding | None:
    """The detection rule for one ``containerStatuses[]`` / ``initContainerStatuses[]`` item.

    Args:
        status: the container status dict.
        init: it is an init container's.
    Returns:
        the finding from the first of ``state.waiting``, ``state.terminated``,
        ``lastState.terminated`` whose ``message`` contains ``exec format error`` (any case),
        or None. Reasons and exit codes are recorded, not required: the text is what each
        runtime has in common (module docstring).
    """
    for name, obj in _states(status):
        message = str(obj.get("message") or "")
        if EXEC_FORMAT_TEXT not in message.lower():
            continue
        program = None
        for pattern in _PATHS:
            match = pattern.search(message)
            if match:
                program = match.group(1)
                break
        exit_code = obj.get("exitCode")
        image_id = str(status.get("imageID") or "")
        return ExecFormatFinding(
            container=str(status.get("name") or ""), init=init,
            restart_count=int(status.get("restartCount") or 0),
            image=str(status.get("image") or ""), image_id=image_id,
            digest=_digest(image_id), field=name, reason=str(obj.get("reason") or ""),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            message=message, program=program)
    return None


def detect(pod: Mapping[str, Any]) -> tuple[ExecFormatFinding, ...]:
    """Every container of ``pod`` (init containers first) whose status shows an exec format
    error (:func:`finding_of`)."""
    status = pod.get("status") or {}
    out: list[ExecFormatFinding] = []
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for item in status.get(key) or ():
            if isinstance(item, Mapping):
                found = finding_of(item, init=init)
                if found is not None:
                    out.append(found)
    return tuple(out)


# --- verify on suspicion ---------------------------------------------------------------------


def _seconds(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A container status with the shape runc and crun leave when ``execve`` fails (module
    docstring): worth a verification, not a finding yet.

    Attributes:
        finding: the finding it becomes once verification proves it (``proof``
            :data:`PROOF_VERIFICATION`, empty message).
    """

    finding: ExecFormatFinding

    @property
    def digest(self) -> str | None:
        """The ``sha256:`` digest of the status ``imageID``."""
        return self.finding.digest


def suspicion_of(status: Mapping[str, Any], *, init: bool = False) -> Suspicion | None:
    """The suspicion rule for one container status (module docstring, "Verify on
    suspicion").

    Args:
        status: the ``containerStatuses[]`` / ``initContainerStatuses[]`` item.
        init: it is an init container's.
    Returns:
        a :class:`Suspicion` for the first of ``state.terminated`` and
        ``lastState.terminated`` with reason ``Error``, an exit code in
        :data:`SUSPECT_EXIT_CODES`, no message (blank) and ``finishedAt`` - ``startedAt``
        between 0 and :data:`SUSPECT_MAX_RUN_SECONDS` (both must parse); None otherwise, and
        None when the status already shows the runtime's words (:func:`finding_of`).
    """
    if finding_of(status, init=init) is not None:
        return None
    for name, obj in _states(status):
        if not name.endswith("terminated") or obj.get("reason") != "Error":
            continue
        code = obj.get("exitCode")
        if isinstance(code, bool) or code not in SUSPECT_EXIT_CODES:
            continue
        if str(obj.get("message") or "").strip():
            continue
        started, finished = _seconds(obj.get("startedAt")), _seconds(obj.get("finishedAt"))
        if started is None or finished is None:
            continue
        ran = finished - started
        if not 0 <= ran <= SUSPECT_MAX_RUN_SECONDS:
            continue
        image_id = str(status.get("imageID") or "")
        return Suspicion(ExecFormatFinding(
            container=str(status.get("name") or ""), init=init,
            restart_count=int(status.get("restartCount") or 0),
            image=str(status.get("image") or ""), image_id=image_id,
            digest=_digest(image_id), field=name, reason="Error", exit_code=int(code),
            message="", program=None, proof=PROOF_VERIFICATION, ran_seconds=int(ran)))
    return None


def suspects(pod: Mapping[str, Any]) -> tuple[Suspicion, ...]:
    """Every container of ``pod`` (init containers first) with a :func:`suspicion_of`."""
    status = pod.get("status") or {}
    out: list[Suspicion] = []
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for item in status.get(key) or ():
            if isinstance(item, Mapping):
                found = suspicion_of(item, init=init)
                if found is not None:
                    out.append(found)
    return tuple(out)


def mismatched(entry: Mapping[str, Any] | None, architecture: str, os: str = LINUX) -> bool:
    """Whether a verification entry (:func:`verification_entry`) flags the platform of
    ``os``/``architecture`` (any variant)."""
    if not entry:
        return False
    for platform in entry.get("mismatched") or ():
        parts = str(platform).split("/")
        if len(parts) >= 2 and parts[0] == os and parts[1] == architecture:
            return True
    return False


def proven_finding(s: Suspicion) -> ExecFormatFinding:
    """The finding a :class:`Suspicion` becomes once verification proves it."""
    return s.finding


def findings_of(pod: Mapping[str, Any],
                verification: Callable[[str], Mapping[str, Any] | None], *,
                architecture: str, os: str = LINUX) -> tuple[ExecFormatFinding, ...]:
    """The pod's findings: those of :func:`detect`, then each suspicion whose digest's
    verification flags the node's platform (``os``/``architecture``)."""
    out = list(detect(pod))
    for s in suspects(pod):
        if s.digest and mismatched(verification(s.digest), architecture, os):
            out.append(proven_finding(s))
    return tuple(out)


def pending_suspicions(pod: Mapping[str, Any],
                       verification: Callable[[str], Mapping[str, Any] | None]
                       ) -> tuple[Suspicion, ...]:
    """The pod's suspicions whose digest has no verification result yet (the monitor
    starts one)."""
    return tuple(s for s in suspects(pod) if s.digest and verification(s.digest) is None)


def placement_digests(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name → the digest placement saw for its image reference (the
    ``images[].digest`` of the pod's ``podplacement.io/decision`` annotation); containers
    of images without one are left out, and so are image volumes (nothing runs from them:
    no exec format error names one)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        record = json.loads(annotations.get(DECISION_ANNOTATION) or "{}")
    except ValueError:
        return {}
    by_image: dict[str, str] = {}
    for entry in (record.get("images") if isinstance(record, dict) else None) or ():
        if isinstance(entry, dict) and isinstance(entry.get("digest"), str):
            by_image[str(entry.get("image"))] = entry["digest"]
    return {c.container: by_image[c.image] for c in pod_images(pod)
            if not c.volume and c.image in by_image}


def spec_image(pod: Mapping[str, Any], f: ExecFormatFinding) -> str:
    """The image reference of ``f``'s container as written in the pod spec ("" if none)."""
    spec = pod.get("spec") or {}
    for c in spec.get("initContainers" if f.init else "containers") or ():
        if isinstance(c, Mapping) and c.get("name") == f.container:
            return str(c.get("image") or "")
    return ""


# --- the pod's record ----------------------------------------------------------------------


def recorded(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's ``podplacement.io/exec-format-error`` annotation decoded:
    ``{"containers": {name: {"restartCount", "imageID", "digest", "arch", "node", "at",
    "proof"}}, "verified": {digest: {"status", "reason", "mismatched": [...], "at"}}}``
    (``at``: unix seconds seen or verified; ``proof``: how the finding was established,
    :data:`PROOF_MESSAGE` when absent); empty parts when absent or unreadable."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        doc = json.loads(annotations.get(EXEC_FORMAT_ANNOTATION) or "{}")
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    containers = doc.get("containers")
    verified = doc.get("verified")
    return {"containers": containers if isinstance(containers, dict) else {},
            "verified": verified if isinstance(verified, dict) else {}}


def unreported(pod: Mapping[str, Any],
               findings: tuple[ExecFormatFinding, ...] | None = None
               ) -> tuple[ExecFormatFinding, ...]:
    """The findings of ``pod`` not in its record yet: a container never recorded, or
    recorded with a lower ``restartCount`` (one Event per pod, container and restart)."""
    seen = recorded(pod)["containers"]
    out = []
    for f in detect(pod) if findings is None else findings:
        prior = seen.get(f.container)
        count = prior.get("restartCount") if isinstance(prior, dict) else None
        if not isinstance(count, int) or f.restart_count > count:
            out.append(f)
    return tuple(out)


def needs_work(pod: Mapping[str, Any],
               verification: Callable[[str], Mapping[str, Any] | None], *,
               architecture: str = "", os: str = LINUX) -> bool:
    """Whether the monitor has something to do for ``pod``: an unreported finding (a
    suspicion counts once its verification flags the node's ``os``/``architecture``), the
    label missing, a verification result for one of its digests not in its record, or a
    finding or suspicion whose digest has no verification yet (whatever the record says: a
    pod's creator can preset the label and the record, which must not keep the controller
    from verifying the image).

    Args:
        verification: digest → the record entry :func:`verification_entry` makes, or None.
        architecture, os: the node's platform ("": unknown; suspicions then prove nothing).
    """
    if pending_suspicions(pod, verification):
        return True
    findings = findings_of(pod, verification, architecture=architecture, os=os)
    if not findings:
        return False
    if any(f.digest and verification(f.digest) is None for f in findings):
        return True
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if unreported(pod, findings) or EXEC_FORMAT_LABEL not in labels:
        return True
    done = recorded(pod)["verified"]
    return any(f.digest and f.digest not in done and verification(f.digest) is not None
               for f in findings)


def updated_record(pod: Mapping[str, Any], new: tuple[ExecFormatFinding, ...], *,
                   arch: str, node: str,
                   verification: Callable[[str], Mapping[str, Any] | None],
                   findings: tuple[ExecFormatFinding, ...] | None = None,
                   at: float | None = None) -> dict[str, Any]:
    """The record after ``new`` findings on ``node`` (``arch``, seen ``at`` unix seconds)
    and the verification results known for the digests of the pod's ``findings`` (default:
    :func:`detect`). Equal to :func:`recorded` when there is nothing new."""
    doc = recorded(pod)
    containers = dict(doc["containers"])
    for f in new:
        item: dict[str, Any] = {"restartCount": f.restart_count, "imageID": f.image_id,
                                "digest": f.digest, "arch": arch, "node": node}
        if at is not None:
            item["at"] = int(at)
        if f.proof != PROOF_MESSAGE:
            item["proof"] = f.proof
        containers[f.container] = item
    verified = dict(doc["verified"])
    for f in detect(pod) if findings is None else findings:
        if f.digest and f.digest not in verified:
            entry = verification(f.digest)
            if entry is not None:
                verified[f.digest] = dict(entry)
    return {"containers": containers, "verified": verified}


def record_patch(pod: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch writing ``record`` and the label, guarded by the pod's
    ``resourceVersion`` (a stale copy gets 409 Conflict)."""
    meta = pod.get("metadata") or {}
    return {"metadata": {
        "resourceVersion": meta.get("resourceVersion"),
        "labels": {EXEC_FORMAT_LABEL: "true"},
        "annotations": {EXEC_FORMAT_ANNOTATION: json.dumps(record, separators=(",", ":"),
                                                           sort_keys=True)},
    }}


def verification_entry(status: str, reason: str, mismatched: tuple[str, ...], *,
                       at: float | None = None) -> dict[str, Any]:
    """A verification result as the record keeps it (``status`` for the node's
    architecture, its reason, every platform flagged, and when it ran: unix seconds)."""
    entry: dict[str, Any] = {"status": status, "reason": reason[:300],
                             "mismatched": list(mismatched)}
    if at is not None:
        entry["at"] = int(at)
    return entry


def event_spec(f: ExecFormatFinding, *, arch: str, node: str,
               verified: Mapping[str, Any] | None = None) -> EventSpec:
    """The Warning ``ExecFormatError`` Event for one finding: container, image digest the
    node runs, the node and its architecture, the restart, and the runtime's words; for a
    suspicion proven by verification (``f.proof``), the shape seen and the verification's
    reason (``verified``: its entry)."""
    kind = "init container" if f.init else "container"
    image_id = f.image_id or "unknown"
    where = (f"image {f.image} digest {f.digest or 'unknown'} (imageID {image_id}) on node "
             f"{node or 'unknown'} of architecture {arch}; restart {f.restart_count}")
    if f.proof == PROOF_VERIFICATION:
        why = str((verified or {}).get("reason") or "its binary is for another machine")
        text = (f"{kind} {f.container} failed with an exec format error, proven by "
                f"verification: {f.field} {f.reason} exit code {f.exit_code} after "
                f"{f.ran_seconds}s without a message (runc and crun report a failed exec "
                f"only in the container's log), and the image's {arch} binary is wrong: "
                f"{why}; {where}")
        return EventSpec(WARNING, EXEC_FORMAT_REASON, text[:1000], "Detect")
    program = f" running {f.program}" if f.program else ""
    exit_code = f", exit code {f.exit_code}" if f.exit_code is not None else ""
    text = (f"{kind} {f.container} failed with an exec format error{program}: {where}; "
            f"{f.field} {f.reason or '-'}{exit_code}: {' '.join(f.message.split())}")
    return EventSpec(WARNING, EXEC_FORMAT_REASON, text[:1000], "Detect")
