"""imageinspect.PullSecretReader: Secrets read through a Kubernetes client, cached briefly."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from podplacement.imageinspect import PullSecretReader
from podplacement.kubeclient import InvalidPathSegment, secret_path


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _Client:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def request(self, method: str, path: str) -> Any:
        self.calls.append(path)
        answer = self.answers[path.rsplit("/", 1)[1]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _secret(host: str) -> dict[str, Any]:
    auth = base64.b64encode(b"u:p").decode()
    config = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return {"type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config).decode()}}


async def test_order_kept_missing_and_forbidden_skipped_reads_cached() -> None:
    clock = [0.0]
    client = _Client({"a": _secret("a.example"), "gone": _Status(404),
                      "denied": _Status(403), "b": _secret("b.example")})
    reader = PullSecretReader(client, secret_path=secret_path, ttl=5.0, clock=lambda: clock[0])
    refs = [("ns", "a"), ("ns", "gone"), ("ns", "denied"), ("ns", "b")]
    creds = await reader.credentials(refs)
    assert [c.pattern for c in creds] == ["a.example", "b.example"]
    await reader.credentials(refs)
    assert len(client.calls) == 4  # all four answers (absences too) cached
    clock[0] = 6.0
    await reader.credentials(refs[:1])
    assert len(client.calls) == 5


async def test_an_undecodable_secret_is_reported_and_skipped_other_errors_raise() -> None:
    bad = {"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "!!"}}
    client = _Client({"bad": bad, "ok": _secret("ok.example"), "down": _Status(500)})
    seen: list[tuple[str, str]] = []
    creds = await PullSecretReader(client, secret_path=secret_path).credentials(
        [("ns", "bad"), ("ns", "ok")], on_invalid=lambda ns, name, exc: seen.append((ns, name)))
    assert [c.pattern for c in creds] == ["ok.example"] and seen == [("ns", "bad")]
    with pytest.raises(_Status):
        await PullSecretReader(client, secret_path=secret_path).credentials([("ns", "down")])


@pytest.mark.parametrize("name", ["..", "../../team-b/secrets/regcred", "%2e%2e", "a/b", "a?b",
                                  "a#b", ".", "RegCred", "x" * 254])
async def test_a_name_that_cannot_be_a_secret_is_never_read_and_reported(name: str) -> None:
    client = _Client({"ok": _secret("ok.example"), "regcred": _secret("b.example")})
    seen: list[tuple[str, str, Exception]] = []
    creds = await PullSecretReader(client, secret_path=secret_path).credentials(
        [("team-a", name), ("team-a", "ok")],
        on_invalid=lambda ns, n, exc: seen.append((ns, n, exc)))
    assert [c.pattern for c in creds] == ["ok.example"]
    assert client.calls == ["/api/v1/namespaces/team-a/secrets/ok"]
    ((ns, got, exc),) = seen
    assert (ns, got) == ("team-a", name) and isinstance(exc, InvalidPathSegment)
    assert "Secret name" in str(exc)
