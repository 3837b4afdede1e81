"""Pod dicts and helpers shared by the controller's pure tests."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from localkube.patch import apply_patch
from localkube.podrules import validate_pod_update
from podplacement.rules.config import GATE_LABEL, GATE_LABEL_GATED, SCHEDULING_GATE


@dataclass(frozen=True, slots=True)
class Plat:
    os: str
    architecture: str
    variant: str | None = None


@dataclass(frozen=True, slots=True)
class Img:
    reference: str
    digest: str
    platforms: tuple[Plat, ...]
    media_type: str = "application/vnd.oci.image.index.v1+json"


def img(ref: str, *plats: str) -> Img:
    """``img("r", "linux/amd64", "linux/arm64/v8")``."""
    out = []
    for p in plats:
        parts = p.split("/")
        out.append(Plat(parts[0], parts[1], parts[2] if len(parts) > 2 else None))
    return Img(ref, "sha256:" + f"{abs(hash(ref)):064x}"[-64:], tuple(out))


def gated_pod(
    *,
    images: tuple[str, ...] = ("reg/app:1",),
    init_images: tuple[str, ...] = (),
    affinity: dict[str, Any] | None = None,
    node_selector: dict[str, str] | None = None,
    gates: tuple[str, ...] = (SCHEDULING_GATE,),
    labels: dict[str, str] | None = None,
    rv: str = "42",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)],
        "schedulingGates": [{"name": g} for g in gates],
    }
    if init_images:
        spec["initContainers"] = [
            {"name": f"i{i}", "image": im} for i, im in enumerate(init_images)
        ]
    if affinity is not None:
        spec["affinity"] = copy.deepcopy(affinity)
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": rv,
            "labels": {GATE_LABEL: GATE_LABEL_GATED} if labels is None else dict(labels),
        },
        "spec": spec,
    }


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]
            }
        }
    }


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply a JSON patch as the API double does (``localkube.patch``, which matches the
    recorded real server), drop an emptied ``schedulingGates`` like the server, and check
    the update with the double's pod update rules (gates, KEP-3838).

    Raises:
        localkube.errors.StatusError: a failed ``test`` (422) or an invalid update.
    """
    out = apply_patch("application/json-patch+json", pod, json.dumps(ops).encode(), strategic=True)
    if out.get("spec", {}).get("schedulingGates") == []:
        del out["spec"]["schedulingGates"]
    validate_pod_update(pod, out)
    return out


def terms_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
    na = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(req.get("nodeSelectorTerms") or [])


def assert_kep3838(old: dict[str, Any], new: dict[str, Any]) -> None:
    """KEP-3838 on a gated pod: with old terms, the list keeps its length and each term's
    expressions and fields only grow at the end."""
    old_terms, new_terms = terms_of(old), terms_of(new)
    if not old_terms:
        return
    assert len(new_terms) == len(old_terms)
    for o, n in zip(old_terms, new_terms, strict=True):
        for field in ("matchExpressions", "matchFields"):
            ol, nl = o.get(field) or [], n.get(field) or []
            assert nl[: len(ol)] == ol, f"{field} changed: {ol} -> {nl}"
