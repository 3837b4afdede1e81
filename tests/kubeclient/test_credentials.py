"""The one kubeconfig loader keeps its token fresh: an ``exec`` plugin runs again after a
401 (the request is retried once) and before its token expires, a ``tokenFile`` is re-read;
against a real HTTP server on 127.0.0.1 and against the real kube-apiserver."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from podplacement.kubeclient import ApiError, ConfigCredentials, KubeAPI, load_configuration
from tests.harness.aioserver import serving
from tests.harness.kube import KubeEnv

# Prints an ExecCredential whose token counts the runs (token-1, token-2, ...), or the
# tokens listed in $TOKENS in turn; $EXPIRES_IN (seconds) adds an expirationTimestamp.
PLUGIN = """\
import datetime, json, os, pathlib
counter = pathlib.Path(os.environ["COUNTER"])
n = int(counter.read_text() or "0") + 1 if counter.exists() else 1
counter.write_text(str(n))
tokens = [t for t in os.environ.get("TOKENS", "").split(",") if t]
status = {"token": tokens[min(n, len(tokens)) - 1] if tokens else f"token-{n}"}
if os.environ.get("EXPIRES_IN"):
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
        seconds=float(os.environ["EXPIRES_IN"]))
    status["expirationTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1",
                  "kind": "ExecCredential", "status": status}))
"""


@dataclass
class Plugin:
    """An exec credential plugin and its run counter."""

    script: Path
    counter: Path

    @property
    def runs(self) -> int:
        return int(self.counter.read_text()) if self.counter.exists() else 0

    def user(self, **env: str) -> dict[str, Any]:
        """The kubeconfig ``user`` section that runs this plugin with ``env``."""
        pairs = {"COUNTER": str(self.counter), **env}
        return {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
            "args": [str(self.script)], "interactiveMode": "Never",
            "env": [{"name": k, "value": v} for k, v in pairs.items()]}}


@pytest.fixture
def plugin(tmp_path: Path) -> Plugin:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    return Plugin(script, tmp_path / "runs")


def write_kubeconfig(path: Path, server: str, user: dict[str, Any],
                     cluster: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))
    return path


@dataclass
class TokenServer:
    """An HTTP API on 127.0.0.1 that accepts only ``Bearer token-{accepted}``."""

    url: str
    accepted: int = 1
    seen: list[str] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[TokenServer]:
    state = TokenServer("")

    async def namespaces(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        state.seen.append(header)
        if header != f"Bearer token-{state.accepted}":
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                 "reason": "Unauthorized", "message": "Unauthorized", "code": 401},
                status=401)
        if request.query.get("watch") == "true":
            event = {"type": "ADDED", "object": {"metadata": {"name": "default",
                                                              "resourceVersion": "2"}}}
            return web.Response(body=json.dumps(event).encode() + b"\n",
                                content_type="application/json")
        return web.json_response({"kind": "NamespaceList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "1"}, "items": []})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces", namespaces)
    async with serving(app) as url:
        state.url = url
        yield state


async def test_exec_plugin_runs_again_after_a_401_and_the_request_is_retried(
    tmp_path: Path, plugin: Plugin, server: TokenServer
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, plugin.user())
    api = await KubeAPI.from_kubeconfig(str(kubeconfig))
    try:
        assert plugin.runs == 1
        await api.request("GET", "/api/v1/namespaces")
        assert server.seen == ["Bearer token-1"]
        # The server stops accepting token-1 (rotated, revoked): one 401, the plugin runs
        # again, and the same request succeeds with token-2.
        server.accepted = 2
        answer = await api.request("GET", "/api/v1/namespaces")
        assert answer["kind"] == "NamespaceList"
        assert server.seen[1:] == ["Bearer token-1", "Bearer token-2"]
        assert plugin.runs == 2
        assert api.counters[("list", 401)] == 1 and api.counters[("list", 200)] == 2
        # A watch refused with 401 is retried the same way.
        server.accepted = 3
        events = [e async for e in api.watch("/api/v1/namespaces", timeout_seconds=5)]
        assert [e["type"] for e in events] == ["ADDED"]
        assert server.seen[3:] == ["Bearer token-2", "Bearer token-3"] and plugin.runs == 3
        # Later requests use the new token without running the plugin.
        await api.request("GET", "/api/v1/namespaces")
        assert server.seen[-1] == "Bearer token-3" and plugin.runs == 3
    finally:
        await api.close()


async def test_a_refused_fresh_token_is_not_retried_again(
    tmp_path: Path, plugin: Plugin, server: TokenServer
) -> None:
    server.accepted = 99
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, plugin.user())
    api = await KubeAPI.from_kubeconfig(str(kubeconfig))
    try:
        with pytest.raises(ApiError) as info:
            await api.request("GET", "/api/v1/namespaces")
        assert info.value.status == 401
        assert server.seen == ["Bearer token-1", "Bearer token-2"] and plugin.runs == 2
    finally:
        await api.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _credentials(kubeconfig: Path, clock: Clock) -> ConfigCredentials:
    async def load() -> tuple[Any, Any]:
        return await load_configuration(str(kubeconfig))

    cfg, loader = await load()
    return ConfigCredentials(cfg, loader, load=load, check_seconds=30.0, clock=clock)


@pytest.mark.parametrize(("expires_in", "runs"), [("30", 2), ("3600", 1), ("", 1)])
async def test_exec_token_is_fetched_again_only_when_it_nears_expiry(
    tmp_path: Path, plugin: Plugin, expires_in: str, runs: int
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9",
                                  plugin.user(EXPIRES_IN=expires_in))
    clock = Clock()
    creds = await _credentials(kubeconfig, clock)
    assert await creds.authorization() == "Bearer token-1"
    clock.now += 10  # within check_seconds: not looked at
    assert await creds.authorization() == "Bearer token-1" and plugin.runs == 1
    clock.now += 30  # 30 s left of a token is less than the 60 s margin: fetched again
    assert await creds.authorization() == f"Bearer token-{runs}"
    assert plugin.runs == runs


async def test_token_file_is_read_again(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9",
                                  {"tokenFile": str(token_file)})
    clock = Clock()
    creds = await _credentials(kubeconfig, clock)
    assert await creds.authorization() == "Bearer first"
    token_file.write_text("second")
    clock.now += 31
    assert await creds.authorization() == "Bearer second"
    token_file.write_text("third")
    assert await creds.refresh("Bearer second") == "Bearer third"  # after a 401
    assert await creds.refresh("Bearer stale") == "Bearer third"  # someone else reloaded


@pytest.mark.realcluster
async def test_real_apiserver_401_runs_the_exec_plugin_again(
    real_kube: KubeEnv, plugin: Plugin, tmp_path: Path
) -> None:
    assert real_kube.token and real_kube.ca_file
    # The first run's token is unknown to the API server; the second is the admin's.
    user = plugin.user(TOKENS=f"not-a-token-{os.getpid()},{real_kube.token}")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", real_kube.url, user,
                                  {"certificate-authority": str(real_kube.ca_file)})
    api = await KubeAPI.from_kubeconfig(str(kubeconfig))
    try:
        answer = await api.request("GET", "/api/v1/namespaces/default")
        assert answer["metadata"]["name"] == "default"
        assert plugin.runs == 2
        assert api.counters[("get", 401)] == 1 and api.counters[("get", 200)] == 1
    finally:
        await api.close()

