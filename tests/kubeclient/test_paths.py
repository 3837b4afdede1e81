"""kubeclient.paths: every API path is built from checked segments (client-go's
``IsValidPathSegmentName``: not ``.``/``..``, no ``/``, no ``%``; and no ``?``, ``#``, ``\\``,
whitespace, control characters, empty or overlong values), Secret names are checked as the
API server checks them (DNS-1123 subdomain), and :class:`KubeAPI` sends no path that fails
the check (a real HTTP server on 127.0.0.1 counts what arrives)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from podplacement.kubeclient import (
    ApiError,
    InvalidPathSegment,
    KubeAPI,
    check_object_name,
    check_path,
    check_segment,
    group_path,
    namespace_path,
    pod_path,
    resource_path,
    secret_path,
    unavailable,
)
from tests.harness.aioserver import serving

#: The traversal and injection forms a pod's creator can write as a name.
HOSTILE = [
    "..", ".", "", "%2e%2e", "%2E%2E", "a/b", "../../team-b/secrets/regcred",
    "..%2f..%2fteam-b%2fsecrets%2fregcred", "a?b", "a#b", "regcred?watch=true",
    "a\\b", "a b", "a\nb", "a\x00b", "a\x7fb", "x" * 254,
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_segment_is_refused_before_any_path_exists(value: str) -> None:
    with pytest.raises(InvalidPathSegment) as info:
        check_segment(value, "name")
    assert isinstance(info.value, ValueError) and isinstance(info.value, ApiError)
    assert info.value.status == 400 and not unavailable(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(InvalidPathSegment):
        resource_path("", "v1", "secrets", namespace="team-a", name=value)
    with pytest.raises(InvalidPathSegment):
        resource_path("", "v1", "secrets", namespace=value, name="regcred")
    with pytest.raises(InvalidPathSegment):
        secret_path("team-a", value)


@pytest.mark.parametrize("value", ["regcred", "a.b-c", "x" * 253, "0", "my.registry.io"])
def test_valid_names_pass_both_checks(value: str) -> None:
    assert check_segment(value) == value
    assert check_object_name(value) == value
    assert secret_path("team-a", value) == f"/api/v1/namespaces/team-a/secrets/{value}"


@pytest.mark.parametrize("value", ["RegCred", "-a", "a-", "a_b", "a..b", "a:b", "é", "x" * 254])
def test_a_secret_name_the_api_server_would_refuse_is_refused(value: str) -> None:
    with pytest.raises(InvalidPathSegment) as info:
        secret_path("team-a", value)
    assert info.value.what == "Secret name"


def test_paths_are_built_as_the_api_server_names_them() -> None:
    assert resource_path("", "v1", "pods") == "/api/v1/pods"
    assert pod_path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert pod_path("ns", "p", "log") == "/api/v1/namespaces/ns/pods/p/log"
    assert pod_path("ns") == "/api/v1/namespaces/ns/pods"
    assert namespace_path("ns") == "/api/v1/namespaces/ns"
    assert resource_path("podplacement.io", "v1beta1", "podplacementpolicies",
                         namespace="ns", name="p", subresource="status") == \
        "/apis/podplacement.io/v1beta1/namespaces/ns/podplacementpolicies/p/status"
    assert group_path("", "v1") == "/api/v1"
    assert group_path("admissionregistration.k8s.io", "v1") == \
        "/apis/admissionregistration.k8s.io/v1"
    with pytest.raises(InvalidPathSegment):
        resource_path("", "v1", "pods", subresource="status")  # no name


@pytest.mark.parametrize("path", [
    "/api/v1/namespaces/team-a/secrets/../../team-b/secrets/regcred",
    "/api/v1/namespaces/team-a/secrets/%2e%2e", "/api/v1/namespaces/team-a/secrets/",
    "/api/v1//pods", "/api/v1/pods?watch=true", "/api/v1/pods#x", "api/v1/pods",
    "/api/v1/namespaces/./pods",
])
def test_check_path_refuses_a_pasted_path(path: str) -> None:
    with pytest.raises(InvalidPathSegment):
        check_path(path)


def test_check_path_keeps_what_the_builder_makes() -> None:
    for path in ("/", "/readyz", "/api/v1/nodes", "/apis/coordination.k8s.io/v1",
                 secret_path("team-a", "regcred")):
        assert check_path(path) == path


@dataclass
class _Server:
    url: str = ""
    paths: list[str] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[_Server]:
    state = _Server()

    async def anything(request: web.Request) -> web.StreamResponse:
        state.paths.append(request.raw_path)
        return web.json_response({"kind": "Status", "status": "Failure", "reason": "NotFound",
                                  "code": 404, "message": "not found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with serving(app) as url:
        state.url = url
        yield state


async def test_kubeapi_sends_no_path_that_fails_the_check(server: _Server) -> None:
    pasted = "/api/v1/namespaces/team-a/secrets/../../team-b/secrets/regcred"
    async with KubeAPI.from_url(server.url) as api:
        with pytest.raises(InvalidPathSegment):
            await api.request("GET", pasted)
        with pytest.raises(InvalidPathSegment):
            await api.request("GET", "/api/v1/namespaces/team-a/secrets/%2e%2e")
        with pytest.raises(InvalidPathSegment):
            async for _ in api.watch("/api/v1/namespaces/../secrets"):
                pass
        with pytest.raises(InvalidPathSegment):
            async for _ in api.list_pages("/api/v1/namespaces/a/secrets/.."):
                pass
        assert server.paths == []
        assert not api.counters  # nothing was sent, so nothing counted
        # a checked path goes out as built
        with pytest.raises(ApiError) as info:
            await api.request("GET", secret_path("team-a", "regcred"))
        assert info.value.status == 404
    assert server.paths == ["/api/v1/namespaces/team-a/secrets/regcred"]


#: The product's packages whose requests must be built by kubeclient.paths. The one template
#: left is certs' own (it imports no Kubernetes client; the controller's subclass overrides
#: it with the builder): ``certs/secretflow.py``'s ``_path``.
_PRODUCT = ("controller", "webhook", "imageinspect", "kubeclient", "certs", "rules")
_TEMPLATE_ALLOWED = {("certs/secretflow.py", "_path")}


def _pasted_paths() -> list[str]:
    """``file:line`` of every f-string that starts an API path with a variable in it, and
    every ``X_PATH.format(...)`` call, in the product's packages."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for package in _PRODUCT:
        for file in sorted((root / package).rglob("*.py")):
            rel = str(file.relative_to(root))
            tree = ast.parse(file.read_text())
            parents = {child: node for node in ast.walk(tree)
                       for child in ast.iter_child_nodes(node)}

            def function_of(node: ast.AST, parents: dict[ast.AST, ast.AST] = parents) -> str:
                while node in parents:
                    node = parents[node]
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                        return node.name
                return ""

            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr) and node.values:
                    head = node.values[0]
                    if (isinstance(head, ast.Constant) and str(head.value).startswith("/api")
                            and any(isinstance(v, ast.FormattedValue) for v in node.values)):
                        found.append(f"{rel}:{node.lineno}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "format"
                      and isinstance(node.func.value, ast.Name)
                      and node.func.value.id.endswith("PATH")
                      and (rel, function_of(node)) not in _TEMPLATE_ALLOWED):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_no_product_module_pastes_a_value_into_an_api_path() -> None:
    assert _pasted_paths() == []
