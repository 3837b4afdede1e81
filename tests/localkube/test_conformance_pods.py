"""Replay the recorded kube-apiserver pod exchanges through localkube's pure pod code.

For every PATCH/PUT in ``gates-a/b/c/d-*.json``, ``optimistic-concurrency.json`` and
``pods-patch-content-types.json``: take the pod as it was before the request (the previous
recorded answer, or the file's ``pod_before`` fields on a recorded pod), apply the request with
:func:`localkube.patch.apply_patch` (or take the PUT body), run
:func:`localkube.podrules.validate_pod_update`, and compare with the recorded answer: the same
Status body for failures (byte for byte, including the Go diff embedded in "pod updates may not
change fields"), the same scheduling fields for successes. Creates are replayed too: defaulting,
the webhook's patch and ``PrepareForCreate`` must give the recorded stored pod.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from localkube import podrules
from localkube.errors import StatusError
from localkube.patch import apply_patch
from tests.harness.reference import REFERENCE

COMPARED_SPEC_FIELDS = ("schedulingGates", "affinity", "nodeSelector", "tolerations")


def _load(name: str) -> dict[str, Any]:
    path = REFERENCE / name
    if not path.is_file():
        pytest.skip(f"reference recording {name} not available")
    return json.loads(path.read_text())


def _pod_name(path: str) -> str:
    match = re.search(r"/pods/([^/?]+)", path)
    assert match, path
    return match.group(1)


def _content_type(request: dict[str, Any]) -> str:
    return str(request.get("content_type") or request["headers"].get("Content-Type", ""))


def _body_bytes(request: dict[str, Any]) -> bytes:
    if "body_raw" in request:
        return str(request["body_raw"]).encode()
    body = request.get("body")
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


def _apply_request(old: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The new pod the request asks for (before update validation)."""
    if request["method"] == "PUT":
        return copy.deepcopy(request["body"])
    media = _content_type(request).split(";", 1)[0].strip()
    manager = parse_qs(urlsplit(request["path"]).query).get("fieldManager", [None])[0]
    return apply_patch(media, old, _body_bytes(request), strategic=True, field_manager=manager)


def _run(old: dict[str, Any], request: dict[str, Any]) -> tuple[int, Any]:
    try:
        new = _apply_request(old, request)
        podrules.validate_pod_update(old, new)
    except StatusError as exc:
        return exc.code, exc.body()
    return 200, new


def _hunk_bodies(message: str) -> list[list[str]]:
    """The changed (+/-) lines of each hunk of an embedded Go diff."""
    hunks: list[list[str]] = []
    for line in message.split("\n"):
        if line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in ("+", "-"):
            hunks[-1].append(line)
    return hunks


def _same_hunks(got: str, want: str) -> bool:
    """The changed lines of two Go diffs as multisets (alignment of repeated lines may differ
    when the rendered pods differ elsewhere, as a live pod's token volume does)."""
    flat = [sorted(line for hunk in _hunk_bodies(m) for line in hunk) for m in (got, want)]
    return flat[0] == flat[1]


def _assert_same_status(
    got: dict[str, Any], want: dict[str, Any], exact_hunks: bool = True
) -> None:
    if exact_hunks or "\n@@" not in want["message"]:
        # localkube renders the Go diff of "pod updates may not change fields" byte for byte
        # when the pod is the recorded one (same token volume and defaults).
        assert got == want
        return
    # "pod updates may not change fields ..." embeds a Go diff of the whole internal PodSpec:
    # its line numbers depend on Go's rendering of every container field, so compare the
    # message prefix and the changed lines of each hunk.
    prefix = want["message"].split("\n", 1)[0]
    assert got["message"].split("\n", 1)[0] == prefix
    assert _same_hunks(got["message"], want["message"])
    assert {k: v for k, v in got.items() if k not in ("message", "details")} == {
        k: v for k, v in want.items() if k not in ("message", "details")
    }
    got_causes = got["details"]["causes"]
    want_causes = want["details"]["causes"]
    assert [(c["reason"], c["field"]) for c in got_causes] == [
        (c["reason"], c["field"]) for c in want_causes
    ]
    for g, w in zip(got_causes, want_causes, strict=True):
        assert g["message"].split("\n", 1)[0] == w["message"].split("\n", 1)[0]
        assert _same_hunks(g["message"], w["message"])


def _assert_same_pod(got: dict[str, Any], want: dict[str, Any]) -> None:
    for field in COMPARED_SPEC_FIELDS:
        assert got["spec"].get(field) == want["spec"].get(field), field
    assert [c["image"] for c in got["spec"]["containers"]] == [
        c["image"] for c in want["spec"]["containers"]
    ]
    for field in ("labels", "annotations"):
        assert got["metadata"].get(field) == want["metadata"].get(field), field


def _sequence_cases(
    filename: str,
) -> list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(case id, pod before, request, recorded response) for a file whose exchanges form a
    sequence: every successful answer is the pod state for the next request on that pod."""
    data = _load(filename)
    state: dict[str, dict[str, Any]] = {}
    cases = []
    for exchange in data["exchanges"]:
        request, response = exchange["request"], exchange["response"]
        body = response.get("body")
        is_pod = isinstance(body, dict) and body.get("kind") == "Pod"
        if request["method"] in ("PATCH", "PUT") and "/status" not in request["path"]:
            name = _pod_name(request["path"])
            if name in state and "?dryRun" not in request["path"]:
                cases.append((f"{filename}:{exchange['name']}", state[name], request, response))
        if is_pod and response["status"] in (200, 201) and "dryRun" not in request["path"]:
            name = body["metadata"]["name"]
            body = copy.deepcopy(body)
            # The recording trims managedFields; server-side apply needs the manager's entry,
            # so carry over the one localkube's own apply computes.
            fields = (state.get(name) or {}).get("metadata", {}).get("managedFields")
            if "fieldManager=" in request["path"] and "apply-patch" in _content_type(request):
                fields = _apply_request(state[name], request)["metadata"].get("managedFields")
            if isinstance(fields, list):
                body["metadata"]["managedFields"] = fields
            else:
                body["metadata"].pop("managedFields", None)
            state[name] = body
    return cases


def _before_from_fields(
    template: dict[str, Any], name: str, fields: dict[str, Any]
) -> dict[str, Any]:
    pod = copy.deepcopy(template)
    pod["metadata"]["name"] = name
    pod["metadata"].pop("annotations", None)
    pod["metadata"]["labels"] = {"app": "gates"}
    for field, value in fields.items():
        if value is None:
            pod["spec"].pop(field, None)
        else:
            pod["spec"][field] = copy.deepcopy(value)
    return pod


def _pod_before_cases(
    filename: str,
) -> list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Cases of gates-c/d: each exchange carries ``pod_before`` (the relevant spec fields)."""
    data = _load(filename)
    template = next(
        e["response"]["body"]
        for e in _load("gates-c-mutable-directives-gated.json")["exchanges"]
        if e["response"]["status"] == 200
    )
    cases = []
    for exchange in data["exchanges"]:
        request = exchange["request"]
        before = _before_from_fields(template, _pod_name(request["path"]), exchange["pod_before"])
        if request["method"] == "PUT":
            # The PUT body is the stored pod with the change; rebuild "before" from it.
            before = copy.deepcopy(request["body"])
            for field, value in exchange["pod_before"].items():
                if value is None:
                    before["spec"].pop(field, None)
                else:
                    before["spec"][field] = copy.deepcopy(value)
        cases.append((f"{filename}:{exchange['name']}", before, request, exchange["response"]))
    return cases


def _all_cases() -> list[Any]:
    cases = []
    for filename in (
        "gates-a-add-gate-rejected.json",
        "gates-b-remove-gate.json",
        "optimistic-concurrency.json",
        "pods-patch-content-types.json",
    ):
        cases.extend(_sequence_cases(filename))
    for filename in (
        "gates-c-mutable-directives-gated.json",
        "gates-d-mutable-directives-ungated.json",
    ):
        cases.extend(_pod_before_cases(filename))
    return [
        pytest.param(before, request, response, id=case_id)
        for case_id, before, request, response in cases
        if not _is_server_level(request, response)
    ]


# Answers that do not come from patching or pod validation (A's server decides them).
NOT_POD_RULES = {
    409,  # resourceVersion preconditions and stale PUTs
    404,
    500,  # non-numeric resourceVersion
}


def _is_server_level(request: dict[str, Any], response: dict[str, Any]) -> bool:
    if response["status"] in NOT_POD_RULES:
        return True
    if "apply-patch" in _content_type(request) and "fieldManager=" not in request["path"]:
        return True  # the fieldManager requirement is checked by the server
    if response["status"] == 415:
        return True  # media type dispatch is checked in test_patch.py
    if request["method"] == "PUT" and response["status"] == 400:
        return True  # name mismatch with the URL
    return False


@pytest.mark.parametrize(("before", "request_", "response"), _all_cases())
def test_recorded_pod_update(
    before: dict[str, Any], request_: dict[str, Any], response: dict[str, Any]
) -> None:
    status, got = _run(before, request_)
    assert status == response["status"], got
    if status == 200:
        _assert_same_pod(got, response["body"])
    else:
        _assert_same_status(got, response["body"])


def test_recorded_cases_cover_every_gate_file() -> None:
    ids = [p.id for p in _all_cases()]
    for prefix in ("gates-a", "gates-b", "gates-c", "gates-d", "optimistic", "pods-patch"):
        assert any(i.startswith(prefix) for i in ids), prefix
    assert len(ids) >= 70


# --- creates: defaulting, PrepareForCreate, webhook patch -----------------------------------

CREATE_FILES = (
    "admission-a-plain-pod.json",
    "admission-c-dry-run.json",
    "admission-d-g-webhook-failures.json",
    "events.json",
    "gates-a-add-gate-rejected.json",
    "gates-b-remove-gate.json",
    "optimistic-concurrency.json",
)


def _webhook_patches(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Pod name -> the JSONPatch the capture webhook answered for it."""
    patches = {}
    for review in data.get("admission_reviews_received") or []:
        obj = review["body"]["request"]["object"]
        if isinstance(obj, dict) and "decoded_patch" in review.get("webhook_answer", {}):
            patches[obj["metadata"].get("name")] = review["webhook_answer"]["decoded_patch"]
    return patches


def _create_cases() -> list[Any]:
    params = []
    for filename in CREATE_FILES:
        data = _load(filename)
        exchanges = list(data.get("exchanges") or [])
        for case in data.get("cases") or []:
            exchanges.extend(case["exchanges"])
        patches = _webhook_patches(data)
        for exchange in exchanges:
            request, response = exchange.get("request") or {}, exchange.get("response") or {}
            path = str(request.get("path", ""))
            if request.get("method") != "POST" or not path.split("?")[0].endswith("/pods"):
                continue
            if response.get("status") not in (200, 201):
                continue
            if not isinstance(request.get("body"), dict):
                continue
            name = request["body"]["metadata"].get("name")
            params.append(
                pytest.param(
                    request["body"],
                    patches.get(name),
                    response["body"],
                    id=f"{filename}:{exchange['name']}",
                )
            )
    return params


def _without_token_volume(spec: dict[str, Any]) -> dict[str, Any]:
    """The ServiceAccount token volume and its mounts are not modelled by localkube."""
    out = {k: v for k, v in spec.items() if k != "volumes"}
    for key in ("containers", "initContainers"):
        if key in out:
            out[key] = [{k: v for k, v in c.items() if k != "volumeMounts"} for c in out[key]]
    return out


def _without_times(status: dict[str, Any]) -> dict[str, Any]:
    out = dict(status)
    if "conditions" in out:
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out["conditions"]
        ]
    return out


@pytest.mark.parametrize(("body", "webhook_patch", "stored"), _create_cases())
def test_recorded_pod_create(
    body: dict[str, Any], webhook_patch: list[dict[str, Any]] | None, stored: dict[str, Any]
) -> None:
    pod = copy.deepcopy(body)
    pod["status"] = {}
    podrules.prepare_pod_create(pod)  # defaulting before admission (as localkube does)
    pod["status"] = {}
    if webhook_patch is not None:
        pod = apply_patch(
            "application/json-patch+json", pod, json.dumps(webhook_patch).encode(), strategic=True
        )
    podrules.prepare_pod_create(pod)  # after admission: PrepareForCreate + validation
    assert _without_token_volume(pod["spec"]) == _without_token_volume(stored["spec"])
    assert _without_times(pod["status"]) == _without_times(stored["status"])
    for field in ("labels", "annotations"):
        assert pod["metadata"].get(field) == stored["metadata"].get(field)


def test_recorded_creates_are_replayed() -> None:
    ids = [p.id for p in _create_cases()]
    assert any("admission-a" in i for i in ids)
    assert any("gates-b" in i for i in ids)
    assert len(ids) >= 10
