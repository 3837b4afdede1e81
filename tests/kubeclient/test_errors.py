"""The API error family of :mod:`kubeclient`: :func:`api_error` maps an HTTP answer to
:class:`NotFound`, :class:`Conflict`, :class:`Invalid`, :class:`Gone` or :class:`Unavailable`
(Kubernetes API conventions, Status reasons; RFC 9110 status codes), the ``not_found`` /
``conflict`` / ``gone`` properties agree with the classes, and real localkube answers
arrive as the subclasses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from podplacement.kubeclient import (
    ApiError,
    Conflict,
    Gone,
    Invalid,
    KubeAPI,
    NotFound,
    Unavailable,
    api_error,
    unavailable,
)
from tests.harness.kube import KubeEnv

_CAUSES: dict[str, Any] = {
    "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
    "details": {"causes": [{"field": "metadata.name", "reason": "FieldValueInvalid"}]},
}
_TEST_FAILED: dict[str, Any] = {
    "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": "the server rejected our request due to an error in our request",
}


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (404, None, NotFound),
        (409, None, Conflict),
        (422, _TEST_FAILED, Conflict),  # a failed JSON-patch ``test``: no causes
        (422, None, Conflict),
        (422, _CAUSES, Invalid),
        (410, None, Gone),
        (0, None, Unavailable),
        (429, None, Unavailable),
        (500, None, Unavailable),
        (502, None, Unavailable),
        (503, None, Unavailable),
        (504, None, Unavailable),
        (400, None, ApiError),
        (401, None, ApiError),
        (403, None, ApiError),
        (405, None, ApiError),
        (501, None, ApiError),
    ],
)
def test_factory_picks_the_subclass(status: int, body: dict[str, Any] | None,
                                    cls: type[ApiError]) -> None:
    exc = api_error(status, "Reason", "message", body)
    assert type(exc) is cls
    assert isinstance(exc, ApiError)
    assert (exc.status, exc.reason, exc.message, exc.body) == (status, "Reason", "message", body)
    assert str(exc) == f"{status} Reason: message"
    # the properties and the classes say the same thing
    assert exc.not_found is isinstance(exc, NotFound)
    assert exc.conflict is isinstance(exc, Conflict)
    assert exc.gone is isinstance(exc, Gone)
    assert unavailable(exc) is isinstance(exc, Unavailable)
    assert isinstance(exc, Invalid) is (status == 422 and body is _CAUSES)


def test_properties_still_work_on_a_plain_api_error() -> None:
    assert ApiError(404, "NotFound", "x").not_found
    assert ApiError(409, "Conflict", "x").conflict
    assert ApiError(422, "Invalid", "x").conflict
    assert not ApiError(422, "Invalid", "x", _CAUSES).conflict
    assert ApiError(410, "Gone", "x").gone
    assert unavailable(ApiError(503, "ServiceUnavailable", "x"))


@pytest.fixture
async def api(fresh_localkube: KubeEnv) -> AsyncIterator[KubeAPI]:
    client = await KubeAPI.from_kubeconfig(str(fresh_localkube.kubeconfig))
    await client.request("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}})
    try:
        yield client
    finally:
        await client.close()


def _cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "a"}, "data": {"k": "v"}}


async def test_except_not_found_catches_a_real_404(api: KubeAPI) -> None:
    caught: NotFound | None = None
    try:
        await api.request("GET", "/api/v1/namespaces/a/configmaps/missing")
    except NotFound as exc:
        caught = exc
    assert caught is not None
    assert caught.status == 404 and caught.reason == "NotFound" and caught.not_found
    assert caught.body is not None and caught.body["kind"] == "Status"
    # a 404 with a text body (an unserved group) is a NotFound too
    with pytest.raises(NotFound) as info:
        await api.request("GET", "/apis/nonexistent.example.com/v1/things")
    assert info.value.body is None


async def test_real_conflicts_and_invalid_objects(api: KubeAPI) -> None:
    await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("one"))
    with pytest.raises(Conflict) as conflict:  # AlreadyExists is a 409
        await api.request("POST", "/api/v1/namespaces/a/configmaps", body=_cm("one"))
    assert conflict.value.status == 409 and conflict.value.conflict
    with pytest.raises(Conflict) as failed_test:  # a failed JSON-patch ``test``
        await api.request("PATCH", "/api/v1/namespaces/a/configmaps/one", body=[
            {"op": "test", "path": "/data/k", "value": "other"},
            {"op": "replace", "path": "/data/k", "value": "w"},
        ])
    assert failed_test.value.conflict and failed_test.value.status in (409, 422)
    with pytest.raises(Invalid) as invalid:  # an events.k8s.io/v1 Event missing its fields
        await api.request("POST", "/apis/events.k8s.io/v1/namespaces/a/events", body={
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "a"}, "type": "Normal"})
    assert invalid.value.status == 422 and invalid.value.reason == "Invalid"
    assert not invalid.value.conflict


async def test_a_transport_failure_is_unavailable() -> None:
    client = KubeAPI.from_url("http://127.0.0.1:9", request_timeout=2)
    try:
        with pytest.raises(Unavailable) as info:
            await client.request("GET", "/api/v1/pods")
        assert info.value.status == 0 and unavailable(info.value)
    finally:
        await client.close()
