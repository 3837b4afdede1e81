"""imageinspect.PullSecretReader: Secrets read through a Kubernetes client, cached briefly."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from podplacement.imageinspect import PullSecretReader


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
    reader = PullSecretReader(client, ttl=5.0, clock=lambda: clock[0])
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
    creds = await PullSecretReader(client).credentials(
        [("ns", "bad"), ("ns", "ok")], on_invalid=lambda ns, name, exc: seen.append((ns, name)))
    assert [c.pattern for c in creds] == ["ok.example"] and seen == [("ns", "bad")]
    with pytest.raises(_Status):
        await PullSecretReader(client).credentials([("ns", "down")])
