"""Hand-written cases for localkube.patch: RFC 6902, RFC 7386, strategic merge, apply."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localkube.errors import StatusError
from localkube.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    JSONPatchError,
    apply_patch,
    merge_patch,
    parse_pointer,
    run_json_patch,
)

GENERIC_422 = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server rejected our request due to an error in our request",
    "reason": "Invalid",
    "details": {},
    "code": 422,
}


def _pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"app": "x", "a/b": "slash", "t~x": "tilde"},
            "finalizers": ["f1", "f2"],
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "nginx:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                },
                {"name": "side", "image": "busybox:1"},
            ],
            "schedulingGates": [{"name": "one"}, {"name": "two"}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]},
                            {"matchExpressions": [{"key": "w", "operator": "Exists"}]},
                        ]
                    }
                }
            },
        },
    }


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _jp(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return apply_patch(JSON_PATCH, obj, _json(ops), strategic=True)


def _smp(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return apply_patch(STRATEGIC_MERGE_PATCH, obj, _json(patch), strategic=True)


# --- JSON patch -----------------------------------------------------------------------------


def test_pointer_unescapes_tilde_and_slash_in_that_order() -> None:
    assert parse_pointer("/metadata/labels/a~1b") == ["metadata", "labels", "a/b"]
    assert parse_pointer("/t~0x") == ["t~x"]
    assert parse_pointer("/~01") == ["~1"]  # ~01 is "~1", not "/"
    assert parse_pointer("") == []


def test_json_patch_add_remove_replace_with_escaped_keys() -> None:
    pod = _pod()
    out = _jp(
        pod,
        [
            {"op": "add", "path": "/metadata/labels/podplacement.io~1gate", "value": "gated"},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
            {"op": "replace", "path": "/metadata/labels/t~0x", "value": "new"},
        ],
    )
    assert out["metadata"]["labels"] == {"app": "x", "t~x": "new", "podplacement.io/gate": "gated"}
    assert pod == _pod()  # the stored object is never modified


def test_json_patch_array_indexes() -> None:
    out = _jp(
        _pod(),
        [
            {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "end"}},
            {"op": "add", "path": "/spec/schedulingGates/0", "value": {"name": "start"}},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ],
    )
    assert [g["name"] for g in out["spec"]["schedulingGates"]] == ["start", "two", "end"]


def test_json_patch_move_copy_and_test() -> None:
    out = _jp(
        _pod(),
        [
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "one"},
            {"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/labels/copy"},
            {"op": "move", "from": "/metadata/labels/app", "path": "/metadata/labels/moved"},
        ],
    )
    assert out["metadata"]["labels"]["copy"] == "x"
    assert out["metadata"]["labels"]["moved"] == "x"
    assert "app" not in out["metadata"]["labels"]


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/metadata/name", "value": "other"}],
        [{"op": "test", "path": "/spec/schedulingGates/0", "value": {"name": "one", "x": 1}}],
        [{"op": "remove", "path": "/spec/schedulingGates/2"}],
        [{"op": "remove", "path": "/spec/schedulingGates/-"}],
        [{"op": "add", "path": "/spec/schedulingGates/3", "value": {"name": "x"}}],
        [{"op": "add", "path": "/metadata/nosuch/x", "value": "1"}],
        [{"op": "replace", "path": "/metadata/nosuch", "value": "1"}],
        [{"op": "remove", "path": "/metadata/labels/nosuch"}],
        [{"op": "frobnicate", "path": "/metadata/labels/x", "value": "1"}],
        [{"op": "add", "value": "1"}],
        [{"op": "move", "from": "/metadata", "path": "/metadata/labels/x"}],
        [{"op": "add", "path": "/spec/schedulingGates/01", "value": {"name": "x"}}],
    ],
)
def test_json_patch_that_does_not_apply_is_the_generic_422(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(StatusError) as info:
        _jp(_pod(), ops)
    assert info.value.body() == GENERIC_422


def test_json_patch_is_all_or_nothing() -> None:
    pod = _pod()
    with pytest.raises(StatusError):
        _jp(
            pod,
            [
                {"op": "remove", "path": "/spec/schedulingGates/0"},
                {"op": "test", "path": "/x", "value": 1},
            ],
        )
    assert pod == _pod()


def test_json_patch_test_compares_types() -> None:
    obj = {"n": 1, "b": True, "f": 1.0}
    assert run_json_patch(obj, [{"op": "test", "path": "/n", "value": 1.0}]) == obj
    with pytest.raises(JSONPatchError):
        run_json_patch(obj, [{"op": "test", "path": "/b", "value": 1}])


def test_json_patch_errors_are_worded_like_evanphx() -> None:
    """The apiserver embeds these in its 500 for a webhook patch (admission-d-g recording)."""
    with pytest.raises(JSONPatchError, match=r"^Unexpected kind: frobnicate$"):
        run_json_patch({}, [{"op": "frobnicate", "path": "/x"}])
    with pytest.raises(
        JSONPatchError,
        match=r"^replace operation does not apply: doc is missing path: /spec/x/0: missing value$",
    ):
        run_json_patch({"spec": {}}, [{"op": "replace", "path": "/spec/x/0", "value": "y"}])


def test_empty_json_patch_returns_an_equal_copy() -> None:
    pod = _pod()
    out = _jp(pod, [])
    assert out == pod and out is not pod


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"{not json",
            "error decoding patch: invalid character 'n' looking for beginning of object key "
            "string",
        ),
        (
            b'{"op":"add","path":"/metadata/labels/x","value":"1"}',
            "error decoding patch: json: cannot unmarshal object into Go value of type "
            "[]handlers.jsonPatchOp",
        ),
        (
            b'["add"]',
            "error decoding patch: json: cannot unmarshal string into Go value of type "
            "handlers.jsonPatchOp",
        ),
        (b"", "error decoding patch: unexpected end of JSON input"),
    ],
)
def test_malformed_json_patch_is_400(body: bytes, message: str) -> None:
    with pytest.raises(StatusError) as info:
        apply_patch(JSON_PATCH, _pod(), body, strategic=True)
    assert info.value.body() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "BadRequest",
        "code": 400,
    }


# --- media types ----------------------------------------------------------------------------


@pytest.mark.parametrize("media", ["application/json", "text/plain", "application/xml"])
def test_other_media_types_are_415(media: str) -> None:
    with pytest.raises(StatusError) as info:
        apply_patch(media, _pod(), b"{}", strategic=True)
    assert info.value.body() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "415: Unsupported Media Type",
        "reason": "UnsupportedMediaType",
        "details": {},
        "code": 415,
    }


def test_strategic_merge_patch_on_a_custom_resource_is_415_listing_accepted_types() -> None:
    with pytest.raises(StatusError) as info:
        apply_patch(STRATEGIC_MERGE_PATCH, {"metadata": {}}, b"{}", strategic=False)
    assert info.value.code == 415
    assert info.value.message == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )


def test_media_type_parameters_are_ignored() -> None:
    out = apply_patch(
        "application/merge-patch+json; charset=utf-8",
        _pod(),
        b'{"metadata":{"labels":{"m":"1"}}}',
        strategic=True,
    )
    assert out["metadata"]["labels"]["m"] == "1"


# --- JSON merge patch (RFC 7386 appendix A) -------------------------------------------------


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(target)
    assert merge_patch(target, patch) == result
    assert target == before


def test_merge_patch_replaces_lists_whole() -> None:
    out = apply_patch(
        MERGE_PATCH, _pod(), _json({"spec": {"schedulingGates": [{"name": "two"}]}}), strategic=True
    )
    assert out["spec"]["schedulingGates"] == [{"name": "two"}]


def test_merge_patch_must_be_an_object() -> None:
    with pytest.raises(StatusError) as info:
        apply_patch(MERGE_PATCH, _pod(), b"[1]", strategic=True)
    assert info.value.code == 400


# --- strategic merge patch ------------------------------------------------------------------


def test_smp_merges_containers_by_name_and_env_by_name() -> None:
    out = _smp(
        _pod(),
        {
            "spec": {
                "containers": [
                    {"name": "app", "image": "nginx:2", "env": [{"name": "B", "value": "3"}]}
                ]
            }
        },
    )
    app, side = out["spec"]["containers"]
    assert (app["name"], app["image"], side["name"]) == ("app", "nginx:2", "side")
    assert app["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]
    assert app["ports"] == [{"containerPort": 80, "protocol": "TCP"}]


def test_smp_puts_new_list_items_before_the_server_only_ones() -> None:
    """strategicpatch.mergeSortedSlice: an item not in the server list sorts first
    (gates-a-add-gate-rejected.json: the new gate is reported at index 0)."""
    out = _smp(_pod(), {"spec": {"schedulingGates": [{"name": "three"}]}})
    assert [g["name"] for g in out["spec"]["schedulingGates"]] == ["three", "one", "two"]


def test_smp_orders_items_by_the_patch_and_interleaves_server_only_items() -> None:
    """normalizeElementOrder: patched items follow the patch order; a server-only item keeps
    its place relative to patched items that are also on the server."""
    both = _smp(_pod(), {"spec": {"schedulingGates": [{"name": "two"}, {"name": "one"}]}})
    assert [g["name"] for g in both["spec"]["schedulingGates"]] == ["two", "one"]
    second_only = _smp(_pod(), {"spec": {"schedulingGates": [{"name": "two", "x": 1}]}})
    assert second_only["spec"]["schedulingGates"] == [{"name": "one"}, {"name": "two", "x": 1}]


def test_smp_set_element_order_reorders() -> None:
    out = _smp(
        _pod(),
        {"spec": {"$setElementOrder/schedulingGates": [{"name": "two"}, {"name": "one"}]}},
    )
    assert [g["name"] for g in out["spec"]["schedulingGates"]] == ["two", "one"]


def test_smp_patch_delete_removes_one_item_by_key() -> None:
    out = _smp(_pod(), {"spec": {"schedulingGates": [{"$patch": "delete", "name": "one"}]}})
    assert out["spec"]["schedulingGates"] == [{"name": "two"}]


def test_smp_patch_replace_on_a_list_and_on_a_map() -> None:
    out = _smp(
        _pod(),
        {
            "metadata": {"labels": {"$patch": "replace", "only": "this"}},
            "spec": {"schedulingGates": [{"name": "new"}, {"$patch": "replace"}]},
        },
    )
    assert out["metadata"]["labels"] == {"only": "this"}
    assert out["spec"]["schedulingGates"] == [{"name": "new"}]


def test_smp_patch_delete_on_a_map_removes_it() -> None:
    out = _smp(_pod(), {"spec": {"affinity": {"$patch": "delete"}}})
    assert "affinity" not in out["spec"]


def test_smp_null_deletes_a_key() -> None:
    out = _smp(_pod(), {"metadata": {"labels": {"app": None}}})
    assert "app" not in out["metadata"]["labels"]


def test_smp_primitive_merge_list_and_delete_from_primitive_list() -> None:
    out = _smp(
        _pod(),
        {"metadata": {"finalizers": ["f3"], "$deleteFromPrimitiveList/finalizers": ["f1"]}},
    )
    assert out["metadata"]["finalizers"] == ["f3", "f2"]


def test_smp_retain_keys_drops_unlisted_fields() -> None:
    obj = {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}
    out = _smp(
        obj,
        {
            "spec": {
                "volumes": [
                    {"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}
                ]
            }
        },
    )
    assert out["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/x"}}]


def test_smp_atomic_lists_are_replaced() -> None:
    """tolerations and nodeSelectorTerms carry no merge strategy: the patch replaces them."""
    terms = [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}
    ]
    out = _smp(
        _pod(),
        {
            "spec": {
                "tolerations": [{"key": "new", "operator": "Exists"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": terms
                        }
                    }
                },
            }
        },
    )
    assert out["spec"]["tolerations"] == [{"key": "new", "operator": "Exists"}]
    required = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == terms


def test_smp_status_conditions_merge_by_type() -> None:
    obj = {
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
        }
    }
    out = _smp(
        obj,
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "reason": "Unschedulable"},
                    {"type": "Ready", "status": "False"},
                ]
            }
        },
    )
    assert out["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
        {"type": "Ready", "status": "False"},
    ]


def test_smp_item_without_merge_key_is_400() -> None:
    with pytest.raises(StatusError) as info:
        _smp(_pod(), {"spec": {"containers": [{"image": "x"}]}})
    assert info.value.code == 400


def test_smp_unknown_directive_is_400() -> None:
    with pytest.raises(StatusError) as info:
        _smp(_pod(), {"metadata": {"$patch": "explode"}})
    assert info.value.code == 400


# --- server-side apply ----------------------------------------------------------------------


def test_apply_yaml_merges_into_the_live_object() -> None:
    body = b"""apiVersion: v1
kind: Pod
metadata:
  name: p
  labels:
    ssa: "1"
spec:
  containers:
  - name: side
    image: busybox:2
"""
    out = apply_patch(APPLY_PATCH, _pod(), body, strategic=True)
    assert out["metadata"]["labels"]["ssa"] == "1"
    assert out["metadata"]["labels"]["app"] == "x"
    assert [(c["name"], c["image"]) for c in out["spec"]["containers"]] == [
        ("app", "nginx:1"),
        ("side", "busybox:2"),
    ]


def test_apply_json_body_on_a_custom_resource_merges_maps() -> None:
    live = {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "a"},
        "spec": {"list": [1, 2], "keep": True},
    }
    out = apply_patch(
        APPLY_PATCH, live, _json({"spec": {"list": [3], "new": None}}), strategic=False
    )
    assert out["spec"] == {"list": [3], "keep": True}


def test_apply_body_must_be_a_map() -> None:
    with pytest.raises(StatusError) as info:
        apply_patch(APPLY_PATCH, _pod(), b"- a\n- b\n", strategic=True)
    assert info.value.code == 400
    with pytest.raises(StatusError):
        apply_patch(APPLY_PATCH, _pod(), b"a: [unclosed", strategic=True)


def _apply(live: dict[str, Any], config: dict[str, Any], manager: str) -> dict[str, Any]:
    return apply_patch(APPLY_PATCH, live, _json(config), strategic=True, field_manager=manager)


def test_apply_records_the_managers_fields() -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"ssa": "1"}},
        "spec": {"containers": [{"name": "side", "image": "busybox:2"}]},
    }
    out = _apply(_pod(), config, "tool")
    (entry,) = out["metadata"]["managedFields"]
    assert {k: entry[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": "tool",
        "operation": "Apply",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
    }
    assert entry["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:ssa": {}}},
        "f:spec": {"f:containers": {'k:{"name":"side"}': {".": {}, "f:image": {}, "f:name": {}}}},
    }


def test_reapplying_without_a_field_removes_it_but_keeps_other_fields() -> None:
    """pods-patch-content-types.json: applying {ssa-yaml} after {ssa} by the same manager
    leaves ssa-yaml and removes ssa; fields nobody applied stay."""
    first = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"ssa": "1"}}}
    second = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"ssa-yaml": "1"}},
    }
    out = _apply(_apply(_pod(), first, "tool"), second, "tool")
    assert out["metadata"]["labels"] == {
        "app": "x",
        "a/b": "slash",
        "t~x": "tilde",
        "ssa-yaml": "1",
    }
    assert len(out["metadata"]["managedFields"]) == 1


def test_other_managers_applied_fields_are_not_removed() -> None:
    mine = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"mine": "1"}}}
    theirs = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"theirs": "1"}},
    }
    out = _apply(_apply(_pod(), mine, "me"), theirs, "them")
    assert out["metadata"]["labels"]["mine"] == "1" and out["metadata"]["labels"]["theirs"] == "1"
    assert [e["manager"] for e in out["metadata"]["managedFields"]] == ["me", "them"]


def test_reapplying_without_a_keyed_item_removes_the_item() -> None:
    config = {"spec": {"containers": [{"name": "extra", "image": "e:1"}]}}
    out = _apply(_apply(_pod(), config, "tool"), {"spec": {}}, "tool")
    assert [c["name"] for c in out["spec"]["containers"]] == ["app", "side"]


# --- properties ---------------------------------------------------------------------------

_keys = st.text(alphabet="ab/~c", min_size=1, max_size=3)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=3),
    max_leaves=8,
)
_objects = st.dictionaries(_keys, _json_values, max_size=4)


def _pointer(*tokens: str) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


@settings(max_examples=60, deadline=None)
@given(_objects, _keys, _json_values)
def test_add_then_remove_restores_the_object(obj: dict[str, Any], key: str, value: Any) -> None:
    obj.pop(key, None)
    added = run_json_patch(obj, [{"op": "add", "path": _pointer(key), "value": value}])
    assert added[key] == value
    assert run_json_patch(added, [{"op": "remove", "path": _pointer(key)}]) == obj


@settings(max_examples=60, deadline=None)
@given(_objects, _objects)
def test_merge_patch_applies_idempotently(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once


@settings(max_examples=60, deadline=None)
@given(_objects)
def test_empty_strategic_patch_changes_nothing(obj: dict[str, Any]) -> None:
    out = apply_patch(STRATEGIC_MERGE_PATCH, obj, b"{}", strategic=True)
    assert out == obj


@pytest.mark.parametrize(
    ("media", "body"),
    [
        (JSON_PATCH, b'[{"op": "add", "path": "/metadata/labels/new", "value": "1"}]'),
        (MERGE_PATCH, b'{"metadata": {"annotations": {"a": "1"}}}'),
        (STRATEGIC_MERGE_PATCH, b'{"metadata": {"annotations": {"a": "1"}}}'),
        (APPLY_PATCH, b'{"metadata": {"annotations": {"a": "1"}}}'),
    ],
)
def test_the_result_shares_nothing_with_the_stored_object(media: str, body: bytes) -> None:
    """localkube mutates the patched object (resourceVersion, generation): the stored one
    must not change with it."""
    stored = _pod()
    out = apply_patch(media, stored, body, strategic=True)
    out["spec"]["containers"][0]["image"] = "changed"
    out["spec"]["schedulingGates"].clear()
    out["metadata"]["labels"]["x"] = "y"
    out["metadata"]["finalizers"].append("f9")
    assert stored == _pod()
