"""controller.lifecycle.guards with a fake API: a 403 while re-applying the uninstall guards is
a failure (the Degraded condition's problem), except when the controller's ServiceAccount is
being deleted: then ``kubectl delete -k deploy/`` took deploy/'s RBAC while a pass was in
flight, and the ordered uninstall follows (the CI failure of stop 44)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from podplacement.controller.lifecycle.guards import UninstallGuards
from podplacement.controller.lifecycle.paths import (
    UNINSTALL_BINDING_PATH,
    UNINSTALL_ROLE_PATH,
    service_account_path,
)
from podplacement.kubeclient import ApiError
from podplacement.kubeclient.errors import api_error
from podplacement.rules import ownership

NS, SA = "podplacement-system", "podplacement-controller"
SA_PATH = service_account_path(NS, SA)
NAMESPACE_OBJ = {"metadata": {"name": NS, "uid": "ns-uid"}}


def _service_account(*, deleting: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": SA, "namespace": NS,
                            "finalizers": [ownership.GUARD_FINALIZER]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T12:20:36Z"
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


class _Api:
    """The uninstall role readable, the binding denied (deploy/'s ClusterRoleBinding just
    deleted), the ServiceAccount as ``service_account`` (None: 404; an ApiError: raised)."""

    def __init__(self, service_account: dict[str, Any] | ApiError | None) -> None:
        self.service_account = service_account
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, *, body: Any = None,
                      content_type: str | None = None,
                      params: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.calls.append((method, path))
        if path == UNINSTALL_ROLE_PATH:
            return ownership.uninstall_role(SA, ownership.namespace_owner(NAMESPACE_OBJ))
        if path == UNINSTALL_BINDING_PATH:
            raise api_error(403, "Forbidden", 'clusterrolebindings.rbac.authorization.k8s.io '
                            '"podplacement-controller-uninstall" is forbidden')
        if path == SA_PATH and method == "GET":
            if isinstance(self.service_account, ApiError):
                raise self.service_account
            if self.service_account is None:
                raise api_error(404, "NotFound", "serviceaccounts not found")
            return self.service_account
        raise AssertionError(f"unexpected {method} {path}")


async def test_a_403_while_the_service_account_is_being_deleted_is_the_uninstall_beginning(
        caplog: pytest.LogCaptureFixture) -> None:
    api = _Api(_service_account(deleting=True))
    guards = UninstallGuards(api, namespace=NS, service_account=(NS, SA))
    with caplog.at_level(logging.INFO, logger="podplacement.controller.lifecycle.guards"):
        await guards.ensure(NAMESPACE_OBJ, _service_account(deleting=False))
    assert guards.problem == ""
    assert ("GET", SA_PATH) in api.calls  # read again, not taken from the pass's reads
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if "forbidden" in r.getMessage().lower()]


@pytest.mark.parametrize("service_account", [
    _service_account(deleting=False),
    None,
    api_error(403, "Forbidden", "serviceaccounts is forbidden"),
], ids=["not-deleting", "gone", "unreadable"])
async def test_a_403_otherwise_is_the_guards_problem(
        service_account: dict[str, Any] | ApiError | None) -> None:
    api = _Api(service_account)
    guards = UninstallGuards(api, namespace=NS, service_account=(NS, SA))
    await guards.ensure(NAMESPACE_OBJ, _service_account(deleting=False))
    assert guards.problem.startswith("uninstall guards: 403 Forbidden"), guards.problem
