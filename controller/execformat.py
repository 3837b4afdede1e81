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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.config import EXEC_FORMAT_ANNOTATION, EXEC_FORMAT_LABEL, EXEC_FORMAT_REASON
from controller.decision import WARNING, EventSpec

#: The text every runtime's message carries (Go: "exec format error"; glibc strerror:
#: "Exec format error").
EXEC_FORMAT_TEXT = "exec format error"

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


# --- the pod's record ----------------------------------------------------------------------


def recorded(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's ``podplacement.io/exec-format-error`` annotation decoded:
    ``{"containers": {name: {"restartCount", "imageID", "digest", "arch", "node"}},
    "verified": {digest: {"status", "reason", "mismatched": [...]}}}``; empty parts when
    absent or unreadable."""
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
               verification: Callable[[str], Mapping[str, Any] | None]) -> bool:
    """Whether the monitor has something to write for ``pod``: an unreported finding, the
    label missing, or a verification result for one of its digests not in its record.

    Args:
        verification: digest → the record entry :func:`verification_entry` makes, or None.
    """
    findings = detect(pod)
    if not findings:
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if unreported(pod, findings) or EXEC_FORMAT_LABEL not in labels:
        return True
    done = recorded(pod)["verified"]
    return any(f.digest and f.digest not in done and verification(f.digest) is not None
               for f in findings)


def updated_record(pod: Mapping[str, Any], new: tuple[ExecFormatFinding, ...], *,
                   arch: str, node: str,
                   verification: Callable[[str], Mapping[str, Any] | None]) -> dict[str, Any]:
    """The record after ``new`` findings on ``node`` (``arch``) and the verification results
    known for the pod's digests. Equal to :func:`recorded` when there is nothing new."""
    doc = recorded(pod)
    containers = dict(doc["containers"])
    for f in new:
        containers[f.container] = {"restartCount": f.restart_count, "imageID": f.image_id,
                                   "digest": f.digest, "arch": arch, "node": node}
    verified = dict(doc["verified"])
    for f in detect(pod):
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


def verification_entry(status: str, reason: str, mismatched: tuple[str, ...]) -> dict[str, Any]:
    """A verification result as the record keeps it (``status`` for the node's
    architecture, its reason, and every platform flagged)."""
    return {"status": status, "reason": reason[:300], "mismatched": list(mismatched)}


def event_spec(f: ExecFormatFinding, *, arch: str, node: str) -> EventSpec:
    """The Warning ``ExecFormatError`` Event for one finding: container, image digest the
    node runs, the node and its architecture, the restart, and the runtime's words."""
    kind = "init container" if f.init else "container"
    program = f" running {f.program}" if f.program else ""
    exit_code = f", exit code {f.exit_code}" if f.exit_code is not None else ""
    text = (f"{kind} {f.container} failed with an exec format error{program}: image "
            f"{f.image} digest {f.digest or 'unknown'} (imageID {f.image_id or 'unknown'}) on "
            f"node {node or 'unknown'} of architecture {arch}; restart {f.restart_count}; "
            f"{f.field} {f.reason or '-'}{exit_code}: {' '.join(f.message.split())}")
    return EventSpec(WARNING, EXEC_FORMAT_REASON, text[:1000], "Detect")
