"""Strategic merge patch for the built-in types localkube serves (pods, nodes, ...).

Follows ``k8s.io/apimachinery/pkg/util/strategicpatch``: lists whose Go field carries
``patchStrategy:"merge"`` are merged by their ``patchMergeKey`` (or as sets of primitives);
every other list is atomic and replaced whole (so a pod's ``nodeSelectorTerms`` and
``tolerations`` are replaced, as ``gates-c-mutable-directives-gated.json`` records). Directives:
``$patch: replace|delete|merge`` (map and list level), ``$retainKeys``,
``$setElementOrder/<field>`` and ``$deleteFromPrimitiveList/<field>``. As in the Go code, list
items that exist only in the patch are placed before the server-only items unless the server
order says otherwise (``strategicpatch.mergeSortedSlice``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PATCH_DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
SET_ELEMENT_ORDER = "$setElementOrder/"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList/"


class SMPError(ValueError):
    """A strategic merge patch that cannot be applied (bad directive, missing merge key)."""


@dataclass(frozen=True)
class ListStrategy:
    """How one list field merges: ``merge_key`` None means a set of primitives."""

    merge_key: str | None


# Field name -> strategy, from the ``patchStrategy``/``patchMergeKey`` tags of the core/v1,
# meta/v1 and admissionregistration/v1 Go types. Field names are unique enough across the types
# localkube serves with SMP (Pod, Node, Namespace, Event, MutatingWebhookConfiguration).
MERGE_LISTS: dict[str, ListStrategy] = {
    # PodSpec
    "containers": ListStrategy("name"),
    "initContainers": ListStrategy("name"),
    "ephemeralContainers": ListStrategy("name"),
    "volumes": ListStrategy("name"),
    "imagePullSecrets": ListStrategy("name"),
    "schedulingGates": ListStrategy("name"),
    "resourceClaims": ListStrategy("name"),
    "hostAliases": ListStrategy("ip"),
    "topologySpreadConstraints": ListStrategy("topologyKey"),
    # Container
    "env": ListStrategy("name"),
    "ports": ListStrategy("containerPort"),
    "volumeMounts": ListStrategy("mountPath"),
    "volumeDevices": ListStrategy("devicePath"),
    "resizePolicy": ListStrategy("resourceName"),
    # ObjectMeta
    "finalizers": ListStrategy(None),
    "ownerReferences": ListStrategy("uid"),
    # PodStatus / NodeStatus
    "conditions": ListStrategy("type"),
    "podIPs": ListStrategy("ip"),
    "hostIPs": ListStrategy("ip"),
    "addresses": ListStrategy("type"),
    # NodeSpec
    "podCIDRs": ListStrategy(None),
    # MutatingWebhookConfiguration
    "webhooks": ListStrategy("name"),
}


def strategic_merge(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Apply a strategic merge ``patch`` to ``original`` (neither is modified).

    Returns:
        the merged object.

    Raises:
        SMPError: unknown ``$patch`` value, list item without its merge key, or a directive of
            the wrong shape.
    """
    merged = _merge_map(original, patch)
    return merged if merged is not None else {}


def _strip(value: Any) -> Any:
    """A patch value with every directive removed (used where there is nothing to merge into)."""
    if isinstance(value, dict):
        if value.get(PATCH_DIRECTIVE) == "delete":
            return None
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        out = []
        for item in value:
            if isinstance(item, dict) and PATCH_DIRECTIVE in item:
                if item[PATCH_DIRECTIVE] in ("delete", "replace"):
                    continue
            out.append(_strip(item))
        return out
    return value


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    directive = patch.get(PATCH_DIRECTIVE)
    if directive is not None:
        if directive == "replace":
            return {k: _strip(v) for k, v in patch.items() if k != PATCH_DIRECTIVE}
        if directive == "delete":
            return None
        if directive != "merge":
            raise SMPError(f"Unknown patch type: {directive!r}")

    result = dict(original)
    retain = patch.get(RETAIN_KEYS)
    if retain is not None:
        if not isinstance(retain, list):
            raise SMPError("$retainKeys must be a list")
        for key in list(result):
            if key not in retain and key not in patch:
                del result[key]

    orders: dict[str, list[Any]] = {}
    deletions: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith(SET_ELEMENT_ORDER):
            if not isinstance(value, list):
                raise SMPError(f"{key} must be a list")
            orders[key[len(SET_ELEMENT_ORDER) :]] = value
        elif key.startswith(DELETE_FROM_PRIMITIVE_LIST):
            if not isinstance(value, list):
                raise SMPError(f"{key} must be a list")
            deletions[key[len(DELETE_FROM_PRIMITIVE_LIST) :]] = value

    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        current = result.get(key)
        if isinstance(value, dict):
            merged = _merge_map(current if isinstance(current, dict) else {}, value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            strategy = MERGE_LISTS.get(key)
            base = current if isinstance(current, list) else []
            if strategy is None:
                result[key] = _merge_atomic(value)
            else:
                result[key] = _merge_list(base, value, strategy, orders.get(key))
        else:
            result[key] = value

    # $deleteFromPrimitiveList and a lone $setElementOrder (no list in the patch) still apply.
    for key, values in deletions.items():
        current = result.get(key)
        if isinstance(current, list):
            result[key] = [item for item in current if item not in values]
    for key, order in orders.items():
        if key in patch:
            continue
        current = result.get(key)
        if isinstance(current, list):
            strategy = MERGE_LISTS.get(key, ListStrategy(None))
            result[key] = _order(current, [], order, current, strategy.merge_key)
    return result


def _merge_atomic(patch_list: list[Any]) -> list[Any]:
    """An atomic list is replaced; a ``{$patch: replace}`` marker in it is just dropped."""
    return [_strip(item) for item in patch_list if not _is_directive_item(item)]


def _is_directive_item(item: Any) -> bool:
    return isinstance(item, dict) and PATCH_DIRECTIVE in item and len(item) == 1


def _identity(item: Any, merge_key: str | None) -> Any:
    if merge_key is None:
        return ("p", repr(item))
    if not isinstance(item, dict) or merge_key not in item:
        raise SMPError(f"map: {item} does not contain declared merge key: {merge_key}")
    return ("k", repr(item[merge_key]))


def _merge_list(
    original: list[Any],
    patch_list: list[Any],
    strategy: ListStrategy,
    order: list[Any] | None,
) -> list[Any]:
    key = strategy.merge_key
    for item in patch_list:
        if isinstance(item, dict) and item.get(PATCH_DIRECTIVE) == "replace":
            return [_strip(i) for i in patch_list if i is not item]

    merged = list(original)
    patch_items: list[Any] = []
    for item in patch_list:
        if key is None:
            if isinstance(item, dict):
                raise SMPError("primitive list item cannot be a map")
            if item not in merged:
                merged.append(item)
            patch_items.append(item)
            continue
        ident = _identity(item, key)
        index = next(
            (
                i
                for i, cur in enumerate(merged)
                if isinstance(cur, dict) and _identity(cur, key) == ident
            ),
            None,
        )
        directive = item.get(PATCH_DIRECTIVE)
        if directive == "delete":
            if index is not None:
                del merged[index]
            continue
        if directive not in (None, "merge"):
            raise SMPError(f"Unknown patch type: {directive!r}")
        if index is None:
            merged.append(_strip(item))
        else:
            out = _merge_map(merged[index], item)
            merged[index] = out if out is not None else merged[index]
        patch_items.append(item)
    return _order(merged, patch_items, order, original, key)


def _order(
    merged: list[Any],
    patch_items: list[Any],
    order: list[Any] | None,
    server_order: list[Any],
    key: str | None,
) -> list[Any]:
    """``strategicpatch.normalizeElementOrder`` + ``mergeSortedSlice``."""
    order_list = order if order is not None else patch_items

    def ident(item: Any) -> Any:
        if key is None:
            return ("p", repr(item))
        if isinstance(item, dict) and key in item:
            return ("k", repr(item[key]))
        return ("p", repr(item))

    wanted = {ident(x): i for i, x in enumerate(order_list)}
    server = {ident(x): i for i, x in enumerate(server_order)}
    from_patch = sorted((x for x in merged if ident(x) in wanted), key=lambda x: wanted[ident(x)])
    server_only = [x for x in merged if ident(x) not in wanted]

    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(from_patch):
        if i >= len(server_only):
            out.append(from_patch[j])
            j += 1
        elif j >= len(from_patch):
            out.append(server_only[i])
            i += 1
        else:
            li = server.get(ident(server_only[i]))
            ri = server.get(ident(from_patch[j]))
            if li is not None and ri is not None and li < ri:
                out.append(server_only[i])
                i += 1
            else:
                out.append(from_patch[j])
                j += 1
    return out
