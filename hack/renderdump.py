"""Dump the rendered admission objects (the MutatingAdmissionPolicy, its binding, the params
object and a ParamsStore's content, the MutatingWebhookConfiguration) for a few fixed
PodPlacementConfigs as canonical JSON on stdout, to compare two trees byte for byte.

Works with the rooms layout (``rules.admit.*``) and the flat one before it (``rules.*``), so
the same script run in a worktree of an older commit gives the "before".

Usage (from a repository root)::

    PYTHONPATH=$PWD python hack/renderdump.py > /tmp/after.json
"""

from __future__ import annotations

import importlib
import json
import sys
from types import ModuleType
from typing import Any


def _mod(room: str, name: str) -> ModuleType:
    """``podplacement.rules.<room>.<name>``, else the flat ``podplacement.rules.<name>``."""
    try:
        return importlib.import_module(f"podplacement.rules.{room}.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"podplacement.rules.{name}")


#: The PodPlacementConfig objects rendered (None: no config object).
CONFIGS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "default": {"spec": {}},
    "webhook-only": {"spec": {"mechanism": "Webhook"}},
    "fast-paths-off": {"spec": {"admissionFastPaths": "Disabled"}},
    "selector": {"spec": {"namespaceSelector": {"matchLabels": {"team": "legacy"},
                          "matchExpressions": [{"key": "tier", "operator": "In",
                                                "values": ["b", "a"]}]}}},
    "preferred": {"spec": {"preferredPlatforms": [{"architecture": "arm64", "weight": 60},
                                                  {"architecture": "amd64", "weight": 10}]}},
    "bad": {"spec": {"mechanism": 7}},
}

OWNER = [{"apiVersion": "v1", "kind": "Namespace", "name": "podplacement", "uid": "u-1"}]


def dump() -> dict[str, Any]:
    """Every rendering, keyed by config name and object."""
    ap = _mod("admit", "admissionpolicy")
    wc = _mod("admit", "webhookconfig")
    ip = _mod("admit", "imageparams")
    out: dict[str, Any] = {}
    for name, obj in CONFIGS.items():
        config = ap.placement_config(obj)
        selection = wc.webhook_namespace_selection(obj, "podplacement")
        out[name] = {
            "policy": ap.desired_policy(config, OWNER),
            "policy-no-owner": ap.desired_policy(config),
            "binding": ap.desired_binding(selection, params_namespace="podplacement",
                                          owner=OWNER),
            "webhook": wc.desired_webhook_configuration(
                obj, ca_bundle=b"PEM", service=("podplacement", "podplacement-webhook", 443,
                                                "/mutate"),
                own_namespace="podplacement", owner=OWNER),
            "webhook-url-skip-placed": wc.desired_webhook_configuration(
                obj, ca_bundle=None, url="https://127.0.0.1:8443/mutate",
                own_namespace="podplacement", skip_placed=True),
        }
    store = ip.ParamsStore(ttl_seconds=3600.0)
    store.record("reg.example/a:1", [("linux", "amd64"), ("linux", "arm64")], 1000.0,
                 learned=990.0)
    store.record("reg.example/b@sha256:" + "0" * 64, [("linux", "arm64")], 1000.0)
    store.record("reg.example/a:2", [("linux", "amd64")], 1000.0, learned=995.0)
    store.record("reg.example:5000/c", [("linux", "arm64")], 1000.0)
    # the dense catalog (repositories, platformSets, learnedAt); the flat one before it
    catalog = (store.catalog() if hasattr(store, "catalog")
               else {"images": store.images(), "learned": store.learned()})
    out["params"] = {"object": ap.params_object("podplacement"), **catalog,
                     "value": ip.platforms_value(
                         [("linux", "arm64"), ("windows", "amd64"), ("linux", "amd64")])}
    return out


def main() -> int:
    """Print :func:`dump` as sorted, indented JSON."""
    json.dump(dump(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
