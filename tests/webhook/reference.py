"""Helpers to read the recorded AdmissionReview exchanges (``tests.harness.reference``)."""

from __future__ import annotations

import json
from typing import Any

from tests.harness.reference import REFERENCE

#: raw AdmissionReview body file -> (recording file, uid) whose decoded answer patch it matches
RAW_CASES = {
    "a-plain-pod": "admission-a-plain-pod.json",
    "a-no-labels": "admission-a-plain-pod.json",
    "b-deployment-pod": "admission-b-deployment-pod.json",
    "c-dry-run-kubectl": "admission-c-dry-run.json",
}


def raw_body(case: str) -> bytes:
    """Byte-exact AdmissionReview request body of a recorded case."""
    return (REFERENCE / f"admission-review-raw-{case}.json").read_bytes()


def recorded_answer(case: str) -> dict[str, Any]:
    """The recorded ``admission_reviews_received`` entry whose request uid matches ``case``."""
    uid = json.loads(raw_body(case))["request"]["uid"]
    recording = json.loads((REFERENCE / RAW_CASES[case]).read_text())
    for entry in recording["admission_reviews_received"]:
        if entry["body"]["request"]["uid"] == uid:
            return entry
    raise LookupError(f"no recorded answer for {case} ({uid})")


def stored_pod(case: str) -> dict[str, Any]:
    """The pod the API server stored after admission (the create's 201 body or a GET)."""
    meta = json.loads(raw_body(case))["request"]["object"]["metadata"]
    recording = json.loads((REFERENCE / RAW_CASES[case]).read_text())
    for ex in recording["exchanges"]:
        body = ex["response"].get("body")
        if not (isinstance(body, dict) and body.get("kind") == "Pod"):
            continue
        got = body["metadata"]
        if ("name" in meta and got["name"] == meta["name"]) or (
            "generateName" in meta and got.get("generateName") == meta["generateName"]
        ):
            return body
    raise LookupError(f"no stored pod for {case}")


def apply_add_ops(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply RFC 6902 ``add`` operations (the only op the webhook emits) to ``doc`` in place.

    Raises KeyError/IndexError when a parent is missing, as the API server's applier fails.
    """
    for op in ops:
        assert op["op"] == "add", op
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        else:
            parent[last] = op["value"]
    return doc
