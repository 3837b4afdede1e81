"""The real-registry test harness: every docker-registry variant accepts pushes and serves
them back byte-exact, the auth variants challenge as distribution documents (Basic; Bearer
realm/service/scope per Docker registry token authentication), indexes with attestation and
windows entries round-trip, and the fault proxy injects its faults."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

import podplacement.sandbox.registry as sandbox_registry
from tests.harness.faults import FaultProxy
from tests.harness.oci import (
    ATTESTATION_REF_DIGEST,
    ATTESTATION_REF_TYPE,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    IN_TOTO,
    MANIFEST_ACCEPT,
    OCI_INDEX,
    OCI_MANIFEST,
    Pusher,
    parse_challenge,
    parse_platform,
)
from tests.harness.registry import Registry
from tests.harness.registry_fixtures import FaultProxyFactory, PusherFactory
from tests.harness.tokenserver import TokenServer, parse_scope, start_token_server

VARIANTS = ["registry", "tls_registry", "basic_registry", "token_registry"]


def _basic(reg: Registry) -> dict[str, str]:
    raw = f"{reg.username}:{reg.password}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def _token(reg: Registry, scope: str, *, auth: bool = True) -> httpx.Response:
    assert reg.token_server is not None
    with httpx.Client(verify=reg.verify()) as client:
        return client.get(
            reg.token_server.realm,
            params={"service": reg.token_server.service, "scope": scope},
            headers=_basic(reg) if auth else {},
        )


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", ["docker", "oci"])
def test_variant_serves_pushed_manifest_and_blobs_byte_exact(
    variant: str, fmt: str, request: pytest.FixtureRequest, pusher: PusherFactory
) -> None:
    reg: Registry = request.getfixturevalue(variant)
    push = pusher(reg)
    repo = f"harness/roundtrip-{fmt}"
    image = push.image(repo, "v1", architecture="arm64", variant="v8", fmt=fmt)

    for ref in ("v1", image.digest):
        resp = push.get_manifest(repo, ref)
        assert resp.status_code == 200, resp.text
        assert resp.content == image.body
        assert resp.headers["Content-Type"] == (OCI_MANIFEST if fmt == "oci" else DOCKER_MANIFEST)
        assert resp.headers["Docker-Content-Digest"] == image.digest == _sha(resp.content)

    manifest = json.loads(image.body)
    config = push._client.get(f"/v2/{repo}/blobs/{manifest['config']['digest']}")
    assert config.status_code == 200
    assert _sha(config.content) == manifest["config"]["digest"]
    assert json.loads(config.content)["architecture"] == "arm64"
    assert json.loads(config.content)["variant"] == "v8"
    layer_digest = manifest["layers"][0]["digest"]
    head = push._client.head(f"/v2/{repo}/blobs/{layer_digest}")
    assert head.status_code == 200
    assert int(head.headers["Content-Length"]) == manifest["layers"][0]["size"]


def test_tls_registry_is_trusted_only_through_its_ca(tls_registry: Registry) -> None:
    assert tls_registry.url.startswith("https://127.0.0.1:")
    assert tls_registry.ca_pem is not None
    with httpx.Client(verify=tls_registry.verify()) as client:
        assert client.get(f"{tls_registry.url}/v2/").status_code == 200
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get(f"{tls_registry.url}/v2/")


def test_plain_registry_has_no_ca_and_answers_anonymously(registry: Registry) -> None:
    assert registry.url == f"http://{registry.host}"
    assert registry.ca_pem is None
    assert registry.auth == "none"
    assert httpx.get(f"{registry.url}/v2/").status_code == 200


def test_basic_registry_challenges_without_credentials(
    basic_registry: Registry, pusher: PusherFactory
) -> None:
    pusher(basic_registry).image("harness/basic", "v1")
    url = f"{basic_registry.url}/v2/harness/basic/manifests/v1"
    with httpx.Client(verify=basic_registry.verify()) as client:
        anonymous = client.get(url, headers={"Accept": MANIFEST_ACCEPT})
        assert anonymous.status_code == 401
        scheme, params = parse_challenge(anonymous.headers["WWW-Authenticate"])
        assert scheme == "basic"
        assert "realm" in params
        wrong = client.get(url, headers={"Accept": MANIFEST_ACCEPT}, auth=("tester", "nope"))
        assert wrong.status_code == 401
        good = client.get(url, headers={"Accept": MANIFEST_ACCEPT, **_basic(basic_registry)})
        assert good.status_code == 200


def test_token_registry_challenges_with_bearer_realm_service_scope(
    token_registry: Registry, pusher: PusherFactory
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    pushed = pusher(token_registry).image("harness/token", "v1")
    url = f"{token_registry.url}/v2/harness/token/manifests/v1"
    with httpx.Client(verify=token_registry.verify()) as client:
        challenge = client.get(url, headers={"Accept": MANIFEST_ACCEPT})
        assert challenge.status_code == 401
        scheme, params = parse_challenge(challenge.headers["WWW-Authenticate"])
        assert scheme == "bearer"
        assert params["realm"] == ts.realm
        assert params["service"] == ts.service
        assert params["scope"] == "repository:harness/token:pull"

        before = len(ts.token_requests())
        answer = _token(token_registry, params["scope"])
        assert answer.status_code == 200
        body = answer.json()
        assert body["expires_in"] == ts.expires_in
        assert body["token"] == body["access_token"]
        assert len(ts.token_requests()) == before + 1
        assert ts.token_requests()[-1].username == token_registry.username

        headers = {"Accept": MANIFEST_ACCEPT, "Authorization": f"Bearer {body['token']}"}
        ok = client.get(url, headers=headers)
        assert ok.status_code == 200
        assert ok.content == pushed.body


def test_token_is_rs256_with_x5c_and_registry_claims(token_registry: Registry) -> None:
    ts = token_registry.token_server
    assert ts is not None
    token = _token(token_registry, "repository:harness/token:pull,push").json()["token"]
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256"
    assert len(header["x5c"]) >= 1
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == ts.issuer
    assert claims["aud"] == ts.service
    assert claims["access"] == [
        {"type": "repository", "name": "harness/token", "actions": ["pull", "push"]}
    ]
    assert claims["exp"] > claims["iat"] >= claims["nbf"]


def test_token_server_refuses_wrong_or_missing_credentials(token_registry: Registry) -> None:
    ts = token_registry.token_server
    assert ts is not None
    assert _token(token_registry, "repository:x:pull", auth=False).status_code == 401
    with httpx.Client(verify=token_registry.verify()) as client:
        wrong = client.get(
            ts.realm, params={"service": ts.service}, auth=(token_registry.username or "", "bad")
        )
    assert wrong.status_code == 401
    assert ts.token_requests()[-1].status == 401


def test_token_server_oauth2_password_grant(
    token_registry: Registry, pusher: PusherFactory
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    pusher(token_registry).image("harness/oauth", "v1")
    form = {
        "grant_type": "password",
        "username": token_registry.username or "",
        "password": token_registry.password or "",
        "service": ts.service,
        "scope": "repository:harness/oauth:pull",
    }
    with httpx.Client(verify=token_registry.verify()) as client:
        answer = client.post(ts.realm, data=form)
        assert answer.status_code == 200
        token = answer.json()["access_token"]
        tags = client.get(
            f"{token_registry.url}/v2/harness/oauth/tags/list",
            headers={"Authorization": f"Bearer {token}"},
        )
        refused = client.post(ts.realm, data={**form, "password": "wrong"})
    assert tags.status_code == 200
    assert tags.json()["tags"] == ["v1"]
    assert refused.status_code == 401
    assert ts.token_requests()[-1].method == "POST"


def test_anonymous_pull_token_cannot_push(token_registry: Registry) -> None:
    ts = token_registry.token_server
    assert ts is not None
    ts.anonymous_pull = True
    try:
        answer = _token(token_registry, "repository:harness/anon:pull,push", auth=False)
    finally:
        ts.anonymous_pull = False
    assert answer.status_code == 200
    token = answer.json()["token"]
    assert jwt.decode(token, options={"verify_signature": False})["access"][0]["actions"] == [
        "pull"
    ]
    with httpx.Client(verify=token_registry.verify()) as client:
        upload = client.post(
            f"{token_registry.url}/v2/harness/anon/blobs/uploads/",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert upload.status_code == 401


def test_registry_rejects_expired_token(token_registry: Registry) -> None:
    ts = token_registry.token_server
    assert ts is not None
    ts.claim_lifetime = -600  # beyond distribution's 60 s leeway
    try:
        token = _token(token_registry, "repository:harness/token:pull").json()["token"]
    finally:
        ts.claim_lifetime = None
    with httpx.Client(verify=token_registry.verify()) as client:
        resp = client.get(
            f"{token_registry.url}/v2/harness/token/tags/list",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert resp.status_code == 401


@pytest.mark.parametrize("field", ["token", "access_token"])
def test_pusher_accepts_single_token_field(
    token_registry: Registry, field: str, pusher: PusherFactory
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    ts.token_field = field
    try:
        answer = _token(token_registry, "repository:harness/field:pull").json()
        with Pusher(token_registry) as push:
            pushed = push.image(f"harness/field-{field.replace('_', '-')}", "v1")
            got = push.get_manifest(f"harness/field-{field.replace('_', '-')}", "v1")
    finally:
        ts.token_field = "both"
    assert set(answer) == {field, "expires_in", "issued_at"}
    assert push.auth.token_fetches >= 1
    assert got.content == pushed.body


def _entries_by_kind(index: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    images: list[dict[str, Any]] = []
    attestations: list[dict[str, Any]] = []
    for entry in index["manifests"]:
        kind = entry.get("annotations", {}).get(ATTESTATION_REF_TYPE)
        (attestations if kind == "attestation-manifest" else images).append(entry)
    return images, attestations


@pytest.mark.parametrize("variant", ["registry", "token_registry"])
def test_oci_index_with_attestations_and_windows_round_trips(
    variant: str, request: pytest.FixtureRequest, pusher: PusherFactory
) -> None:
    reg: Registry = request.getfixturevalue(variant)
    push = pusher(reg)
    platforms = ["linux/amd64", "linux/arm64/v8", "windows/amd64"]
    index = push.multiarch("harness/multi", "latest", platforms)
    resp = push.get_manifest("harness/multi", "latest")
    assert resp.status_code == 200
    assert resp.content == index.body
    assert resp.headers["Content-Type"] == OCI_INDEX
    assert resp.headers["Docker-Content-Digest"] == index.digest

    doc = json.loads(resp.content)
    images, attestations = _entries_by_kind(doc)
    assert [parse_platform(p) for p in platforms] == [e["platform"] for e in images]
    assert images[2]["platform"]["os.version"].startswith("10.0.")
    assert len(attestations) == len(images)
    assert {a[ATTESTATION_REF_DIGEST] for a in (e["annotations"] for e in attestations)} == {
        e["digest"] for e in images
    }
    for entry in attestations:
        assert entry["platform"] == {"os": "unknown", "architecture": "unknown"}
    for entry in doc["manifests"]:
        child = push.get_manifest("harness/multi", entry["digest"])
        assert child.status_code == 200
        assert child.headers["Content-Type"] == entry["mediaType"] == OCI_MANIFEST
        assert _sha(child.content) == entry["digest"]
        assert len(child.content) == entry["size"]
    attestation = json.loads(push.get_manifest("harness/multi", attestations[0]["digest"]).content)
    assert attestation["layers"][0]["mediaType"] == IN_TOTO


def test_docker_manifest_list_round_trips_without_attestations(
    registry: Registry, pusher: PusherFactory
) -> None:
    push = pusher(registry)
    platforms = ["linux/amd64", "linux/arm/v7"]
    index = push.multiarch("harness/dockerlist", "v1", platforms, fmt="docker")
    resp = push.get_manifest("harness/dockerlist", "v1")
    assert resp.headers["Content-Type"] == DOCKER_LIST
    assert resp.content == index.body
    doc = json.loads(resp.content)
    assert [e["mediaType"] for e in doc["manifests"]] == [DOCKER_MANIFEST, DOCKER_MANIFEST]
    arm = {"os": "linux", "architecture": "arm", "variant": "v7"}
    assert doc["manifests"][1]["platform"] == arm


def test_raw_manifest_and_index_annotations(registry: Registry, pusher: PusherFactory) -> None:
    push = pusher(registry)
    image = push.image("harness/raw", None, fmt="oci")
    index = push.index(
        "harness/raw", "annotated", [(image, {"os": "linux", "architecture": "amd64"})],
        annotations={"org.opencontainers.image.ref.name": "annotated"},
    )
    doc = json.loads(push.get_manifest("harness/raw", "annotated").content)
    assert doc["annotations"] == {"org.opencontainers.image.ref.name": "annotated"}
    assert doc["manifests"][0]["digest"] == image.digest
    body = b'{"schemaVersion": 2, "mediaType": "%s", "manifests": []}' % OCI_INDEX.encode()
    raw = push.raw_manifest("harness/raw", "empty", body, OCI_INDEX)
    assert push.get_manifest("harness/raw", "empty").content == body
    assert raw.digest == _sha(body) != index.digest


def test_parse_helpers() -> None:
    assert parse_scope("repository:127.0.0.1:5000/a:pull,push") == {
        "type": "repository", "name": "127.0.0.1:5000/a", "actions": ["pull", "push"]
    }
    assert parse_scope("nonsense") is None
    assert parse_challenge('Bearer realm="https://a/t",service="s",scope="r:n:pull"') == (
        "bearer", {"realm": "https://a/t", "service": "s", "scope": "r:n:pull"}
    )
    with pytest.raises(ValueError):
        parse_platform("linux")


def _get(proxy: FaultProxy, path: str, timeout: float = 10.0) -> httpx.Response:
    return httpx.get(proxy.url + path, headers={"Accept": MANIFEST_ACCEPT}, timeout=timeout)


def test_fault_proxy_injects_429_with_retry_after_then_forwards(
    registry: Registry, pusher: PusherFactory, fault_proxy: FaultProxyFactory
) -> None:
    pushed = pusher(registry).image("harness/faults", "v1")
    proxy = fault_proxy(registry)
    proxy.add_rule(path_regex=r"/manifests/", status=429, headers={"Retry-After": "2"}, times=2)
    path = "/v2/harness/faults/manifests/v1"
    first, second, third = (_get(proxy, path) for _ in range(3))
    assert (first.status_code, second.status_code) == (429, 429)
    assert first.headers["Retry-After"] == "2"
    assert third.status_code == 200
    assert third.content == pushed.body
    assert third.headers["Docker-Content-Digest"] == pushed.digest
    assert proxy.requests == [("GET", path)] * 3
    assert [s.faulted for s in proxy.seen] == [True, True, False]


def test_fault_proxy_stall_exceeds_client_timeout_once(
    registry: Registry, pusher: PusherFactory, fault_proxy: FaultProxyFactory
) -> None:
    pusher(registry).image("harness/faults", "v1")
    proxy = fault_proxy(registry)
    proxy.add_rule(path_regex=r"/manifests/v1$", delay=30.0)
    with pytest.raises(httpx.ReadTimeout):
        _get(proxy, "/v2/harness/faults/manifests/v1", timeout=0.3)
    assert _get(proxy, "/v2/harness/faults/manifests/v1").status_code == 200


def test_fault_proxy_replaces_body_and_content_type(
    registry: Registry, pusher: PusherFactory, fault_proxy: FaultProxyFactory
) -> None:
    pushed = pusher(registry).image("harness/faults", "v1")
    proxy = fault_proxy(registry)
    proxy.add_rule(method="GET", replace_body=b"{}", content_type="text/plain")
    tampered = _get(proxy, "/v2/harness/faults/manifests/v1")
    assert tampered.content == b"{}"
    assert tampered.headers["Content-Type"] == "text/plain"
    assert tampered.headers["Docker-Content-Digest"] == pushed.digest  # upstream header kept
    assert _get(proxy, "/v2/harness/faults/manifests/v1").content == pushed.body


def test_fault_proxy_redirect_to_other_origin_and_drop(
    registry: Registry, pusher: PusherFactory, fault_proxy: FaultProxyFactory
) -> None:
    pushed = pusher(registry).image("harness/faults", "v1")
    blob = json.loads(pushed.body)["config"]["digest"]
    front = fault_proxy(registry)
    other = fault_proxy(registry, advertise="localhost")
    assert other.host.startswith("localhost:")
    front.add_rule(path_regex=r"/blobs/", redirect_to=other.url, times=2)
    path = f"/v2/harness/faults/blobs/{blob}"
    redirect = httpx.get(front.url + path, headers={"Authorization": "Bearer secret"})
    assert redirect.status_code == 307
    assert redirect.headers["Location"] == other.url + path
    followed = httpx.get(
        front.url + path, headers={"Authorization": "Bearer secret"}, follow_redirects=True
    )
    assert _sha(followed.content) == blob
    assert other.count("GET", "/blobs/") == 1
    # httpx, like Go's client, drops Authorization when the origin changes
    assert "authorization" not in other.seen[0].headers

    front.add_rule(close=True)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(front.url + "/v2/")


@pytest.mark.parametrize("variant", ["registry", "token_registry"])
def test_push_through_fault_proxy_keeps_uploads_on_the_proxy(
    variant: str, request: pytest.FixtureRequest, fault_proxy: FaultProxyFactory
) -> None:
    upstream: Registry = request.getfixturevalue(variant)
    proxy = fault_proxy(upstream)
    view = proxy.as_registry(upstream)
    with Pusher(view) as push:
        pushed = push.image("harness/via-proxy", "v1", fmt="oci")
        assert push.get_manifest("harness/via-proxy", "v1").content == pushed.body
    view.stop()  # a view never stops the upstream
    assert proxy.count("PUT", r"/blobs/uploads/") >= 1
    assert proxy.count("PUT", r"/manifests/v1$") == 1
    with Pusher(upstream) as direct:
        assert direct.get_manifest("harness/via-proxy", "v1").content == pushed.body


def test_the_test_doubles_print_nothing_when_a_client_hangs_up(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """socketserver would print "Exception occurred during processing of request" and a
    traceback to stderr; a hang-up is no error, and a real error goes to the log."""
    import threading
    from http.server import BaseHTTPRequestHandler

    from tests.harness.httpserver import QuietHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/hangup":
                raise BrokenPipeError("client gone")
            raise ValueError("a bug in the double")

        def log_message(self, *args: Any) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for path in ("/hangup", "/bug"):
            with pytest.raises(httpx.HTTPError):
                httpx.get(url + path, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    _out, err = capfd.readouterr()
    # (the logged error may reach stderr through a handler an earlier test installed)
    assert "Exception occurred" not in err and "client gone" not in err, err
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "a bug in the double" in str(errors[0].exc_info[1])


def test_a_registry_that_fails_to_start_stops_its_token_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token issuer starts before the registry process; when that process can't be
    started, the issuer is stopped too (nothing left listening), and the error is the
    spawn's."""
    started: list[TokenServer] = []

    def issuer(**kwargs: Any) -> TokenServer:
        server = start_token_server(**kwargs)
        started.append(server)
        return server

    def no_spawn(*args: Any, **kwargs: Any) -> Any:
        raise OSError("exec failed")

    monkeypatch.setattr(sandbox_registry.subprocess, "Popen", no_spawn)
    with pytest.raises(OSError, match="exec failed"):
        sandbox_registry.start_registry(tmp_path, auth="token", token_issuer=issuer)
    assert len(started) == 1
    with pytest.raises(httpx.TransportError):
        httpx.get(started[0].realm, timeout=2.0)
