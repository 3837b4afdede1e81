"""Authentication against the real registry: Basic (htpasswd) and Bearer (token server),
credential order as the kubelet tries them, token caching and expiry, and cache isolation
between callers with different credentials."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podplacement.imageinspect import Credential, Platform, Unauthorized
from tests.harness.faults import FaultProxy, SeenRequest
from tests.harness.oci import Pusher
from tests.harness.registry import Registry
from tests.imageinspect.conftest import InspectorFactory, trust


def _cred(reg: Registry, password: str | None = None, pattern: str | None = None) -> Credential:
    return Credential(pattern or reg.host, reg.username or "", password or reg.password or "")


@pytest.fixture(scope="module")
def basic_images(basic_registry: Registry, pusher: object) -> None:
    p: Pusher = pusher(basic_registry)  # type: ignore[operator]
    p.multiarch("auth/app", "v1", ["linux/amd64", "linux/arm64/v8"])


@pytest.fixture(scope="module")
def token_images(token_registry: Registry, pusher: object) -> None:
    p: Pusher = pusher(token_registry)  # type: ignore[operator]
    p.multiarch("auth/app", "v1", ["linux/amd64", "linux/ppc64le"])
    p.image("auth/app", "single", architecture="s390x")
    p.image("auth/other", "v1", architecture="arm64")


@pytest.fixture
def token_server_settings(token_registry: Registry) -> Iterator[object]:
    """The token server, its settings restored after the test."""
    ts = token_registry.token_server
    assert ts is not None
    saved = (ts.expires_in, ts.token_field, ts.anonymous_pull)
    yield ts
    ts.expires_in, ts.token_field, ts.anonymous_pull = saved


async def test_basic_auth_with_credentials(
    basic_registry: Registry, basic_images: None, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(ca_bundles=trust(basic_registry))
    info = await insp.inspect(f"{basic_registry.host}/auth/app:v1", [_cred(basic_registry)])
    assert [str(p) for p in info.platforms] == ["linux/amd64", "linux/arm64/v8"]


async def test_basic_auth_rejects_anonymous_and_wrong_password(
    basic_registry: Registry, basic_images: None, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(ca_bundles=trust(basic_registry))
    image = f"{basic_registry.host}/auth/app:v1"
    with pytest.raises(Unauthorized) as info:
        await insp.inspect(image)
    assert info.value.status == 401 and info.value.registry == basic_registry.host
    with pytest.raises(Unauthorized):
        await insp.inspect(image, [_cred(basic_registry, "wrong")])


async def test_credentials_are_tried_in_kubelet_order_then_anonymous(
    basic_registry: Registry, basic_images: None, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(ca_bundles=trust(basic_registry))
    wrong_specific = _cred(basic_registry, "wrong", pattern=f"{basic_registry.host}/auth")
    right_broad = _cred(basic_registry)
    unrelated = Credential("other.example.com", "x", "y")
    info = await insp.inspect(
        f"{basic_registry.host}/auth/app:v1", [unrelated, right_broad, wrong_specific]
    )
    assert len(info.platforms) == 2


async def test_cache_never_serves_a_private_result_to_a_caller_without_credentials(
    basic_registry: Registry, basic_images: None, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(ca_bundles=trust(basic_registry))
    image = f"{basic_registry.host}/auth/app:v1"
    assert (await insp.inspect(image, [_cred(basic_registry)])).platforms
    with pytest.raises(Unauthorized):
        await insp.inspect(image)
    with pytest.raises(Unauthorized):
        await insp.inspect(image, [_cred(basic_registry, "wrong")])
    # ...and the cached failure of the anonymous caller does not hurt the credentialed one.
    before = insp.stats.requests
    assert (await insp.inspect(image, [_cred(basic_registry)])).platforms
    assert insp.stats.requests == before  # served from its own cache entry


async def test_bearer_token_flow_caches_tokens_per_scope(
    token_registry: Registry,
    token_images: None,
    token_server_settings: object,
    make_inspector: InspectorFactory,
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    insp = await make_inspector(ca_bundles=trust(token_registry))
    creds = [_cred(token_registry)]
    before = len(ts.token_requests())
    info = await insp.inspect(f"{token_registry.host}/auth/app:v1", creds)
    assert [str(p) for p in info.platforms] == ["linux/amd64", "linux/ppc64le"]
    single = await insp.inspect(f"{token_registry.host}/auth/app:single", creds)
    assert single.platforms == (Platform("linux", "s390x"),)
    requests = ts.token_requests()[before:]
    assert len(requests) == 1  # one token for repository:auth/app:pull, reused
    assert requests[0].username == token_registry.username
    assert requests[0].params["scope"] == ["repository:auth/app:pull"]
    # Another repository needs another scope: the token is fetched up front, no extra 401.
    req_before = insp.stats.requests
    await insp.inspect(f"{token_registry.host}/auth/other:v1", creds)
    assert len(ts.token_requests()[before:]) == 2
    assert insp.stats.requests - req_before == 3  # token + manifest + config


async def test_access_token_field_and_expiry(
    token_registry: Registry,
    token_images: None,
    token_server_settings: object,
    make_inspector: InspectorFactory,
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    ts.token_field = "access_token"
    ts.expires_in = 60
    now = [5000.0]
    insp = await make_inspector(ca_bundles=trust(token_registry), clock=lambda: now[0])
    creds = [_cred(token_registry)]
    before = len(ts.token_requests())
    await insp.inspect(f"{token_registry.host}/auth/app:v1", creds)
    now[0] += 30
    await insp.inspect(f"{token_registry.host}/auth/app:v1", creds, pull_always=True)
    assert len(ts.token_requests()) - before == 1
    now[0] += 60  # past expires_in: a new token is needed
    await insp.inspect(f"{token_registry.host}/auth/app:v1", creds, pull_always=True)
    assert len(ts.token_requests()) - before == 2


async def test_anonymous_bearer_pull(
    token_registry: Registry,
    token_images: None,
    token_server_settings: object,
    make_inspector: InspectorFactory,
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    insp = await make_inspector(ca_bundles=trust(token_registry), negative_ttl=0)
    image = f"{token_registry.host}/auth/app:v1"
    with pytest.raises(Unauthorized, match="anonymous"):
        await insp.inspect(image)
    ts.anonymous_pull = True
    info = await insp.inspect(image)
    assert len(info.platforms) == 2
    assert ts.token_requests()[-1].username is None


async def test_wrong_password_at_the_token_server(
    token_registry: Registry, token_images: None, make_inspector: InspectorFactory
) -> None:
    insp = await make_inspector(ca_bundles=trust(token_registry))
    with pytest.raises(Unauthorized) as info:
        await insp.inspect(f"{token_registry.host}/auth/app:v1", [_cred(token_registry, "wrong")])
    assert info.value.status == 401
    assert "wrong" not in str(info.value)


async def _through(proxy: FaultProxy, registry: Registry,
                   make_inspector: InspectorFactory) -> tuple[Any, list[Any]]:
    """An inspector that reaches ``registry`` through the fault ``proxy`` (plain HTTP to the
    proxy, the registry's CA trusted), and the credentials matching the proxy's host."""
    from tests.imageinspect.conftest import insecure

    insp = await make_inspector(registries=insecure(proxy.host), ca_bundles=trust(registry))
    return insp, [_cred(registry, pattern=proxy.host)]


async def test_a_rejected_cached_token_is_replaced_once(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:
    import httpx


    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    insp, creds = await _through(proxy, token_registry, make_inspector)
    await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    tokens_before = len(ts.token_requests())
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{proxy.url}/v2/auth/app/manifests/v1")
    challenge = resp.headers["www-authenticate"]
    # The registry now rejects the cached token once (as after a key rotation).
    proxy.add_rule(
        path_regex="/manifests/", status=401, headers={"WWW-Authenticate": challenge}, times=1
    )
    info = await insp.inspect(f"{proxy.host}/auth/app:single", creds)
    assert info.platforms == (Platform("linux", "s390x"),)
    assert len(ts.token_requests()) - tokens_before == 1


async def test_identity_token_uses_the_oauth2_refresh_grant(
    token_registry: Registry, token_images: None, make_inspector: InspectorFactory
) -> None:
    ts = token_registry.token_server
    assert ts is not None
    insp = await make_inspector(ca_bundles=trust(token_registry))
    cred = Credential(token_registry.host, identity_token="refresh-token-value")
    before = len(ts.token_requests())
    # The harness token server only knows passwords, so it refuses; what matters is the wire.
    with pytest.raises(Unauthorized):
        await insp.inspect(f"{token_registry.host}/auth/app:v1", [cred])
    posts = [r for r in ts.token_requests()[before:] if r.method == "POST"]
    assert len(posts) == 1
    assert posts[0].params["grant_type"] == ["refresh_token"]
    assert posts[0].params["refresh_token"] == ["refresh-token-value"]
    assert posts[0].params["scope"] == ["repository:auth/app:pull"]
    assert "authorization" not in posts[0].headers


# -- challenges per repository, and one re-challenge when a remembered one fails ---------------


def _bearer(realm: str, service: str, repo: str) -> dict[str, str]:
    """A registry 401 challenge header pointing at ``realm``."""
    return {
        "WWW-Authenticate": (
            f'Bearer realm="{realm}",service="{service}",scope="repository:{repo}:pull"'
        )
    }


def _manifest_gets(proxy: FaultProxy) -> list[SeenRequest]:
    """The manifest GETs the proxy saw, oldest first."""
    return [r for r in proxy.seen if r.method == "GET" and "/manifests/" in r.path]


async def test_a_forbidden_realm_for_one_repository_does_not_poison_the_host(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:
    from podplacement.imageinspect import UnsafeAddress
    from tests.imageinspect.conftest import insecure

    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    # The registry's challenge for auth/app (only) sends clients to the metadata service.
    proxy.add_rule(
        path_regex="^/v2/auth/app/",
        status=401,
        headers=_bearer("https://169.254.169.254/token", ts.service, "auth/app"),
        times=0,
    )
    insp = await make_inspector(
        registries=insecure(proxy.host), ca_bundles=trust(token_registry), negative_ttl=0
    )
    creds = [_cred(token_registry, pattern=proxy.host)]
    tokens_before = len(ts.token_requests())
    with pytest.raises(UnsafeAddress) as bad:
        await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    message = str(bad.value)
    # Our words only: the realm the registry sent is not quoted.
    assert "token server named by the registry" in message and "\n" not in message
    assert "169.254" not in message
    assert bad.value.registry == proxy.host
    assert len(ts.token_requests()) == tokens_before  # nothing reached a token server
    # Another repository on the same host, same Inspector: its own challenge is used.
    info = await insp.inspect(f"{proxy.host}/auth/other:v1", creds)
    assert info.platforms == (Platform("linux", "arm64"),)
    # auth/app still fails, and asks the registry once more instead of trusting its memory.
    proxy.reset_requests()
    with pytest.raises(UnsafeAddress):
        await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    assert len(_manifest_gets(proxy)) == 1  # one re-challenge, no loop
    # Once the registry is fixed, the stale challenge is replaced by one re-challenge.
    proxy.clear_rules()
    proxy.reset_requests()
    info = await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    assert [str(p) for p in info.platforms] == ["linux/amd64", "linux/ppc64le"]
    gets = _manifest_gets(proxy)
    assert [(g.status, "authorization" in g.headers) for g in gets] == [
        (401, False),  # the re-challenge, without credentials
        (200, True),  # the retry with the fresh challenge's token
    ]


async def test_a_bad_realm_learned_after_a_good_one_stays_with_its_repository(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:
    from podplacement.imageinspect import UnsafeAddress
    from tests.imageinspect.conftest import insecure

    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    insp = await make_inspector(
        registries=insecure(proxy.host), ca_bundles=trust(token_registry), negative_ttl=0
    )
    creds = [_cred(token_registry, pattern=proxy.host)]
    assert (await insp.inspect(f"{proxy.host}/auth/other:v1", creds)).platforms
    proxy.add_rule(
        path_regex="^/v2/auth/app/",
        status=401,
        headers=_bearer("https://169.254.169.254/token", ts.service, "auth/app"),
        times=0,
    )
    with pytest.raises(UnsafeAddress):
        await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    # auth/other keeps its working challenge and token: no token request, no 401.
    tokens_before = len(ts.token_requests())
    proxy.reset_requests()
    info = await insp.inspect(f"{proxy.host}/auth/other:v1", creds, pull_always=True)
    assert info.platforms == (Platform("linux", "arm64"),)
    assert len(ts.token_requests()) == tokens_before
    assert [r.status for r in proxy.seen] == [200]  # the one HEAD revalidation


async def test_a_stale_challenge_whose_realm_moved_is_recovered_by_one_rechallenge(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:
    from tests.imageinspect.conftest import insecure

    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    # The first challenge names an old realm: a proxy in front of the real token server.
    old_realm = fault_proxy(ts.url, ca_pem=token_registry.ca_pem)  # type: ignore[operator]
    proxy.add_rule(
        path_regex="^/v2/auth/app/manifests/",
        status=401,
        headers=_bearer(f"{old_realm.url}/token", ts.service, "auth/app"),
        times=1,
    )
    now = [1000.0]
    insp = await make_inspector(
        registries=insecure(proxy.host), ca_bundles=trust(token_registry), clock=lambda: now[0]
    )
    creds = [_cred(token_registry, pattern=proxy.host)]
    await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    assert old_realm.count("GET", "^/token$") == 1
    # The old realm goes away and the cached token expires; the registry now names its real
    # realm (the token server itself).
    old_realm.stop()
    now[0] += 3600
    tokens_before = len(ts.token_requests())
    proxy.reset_requests()
    info = await insp.inspect(f"{proxy.host}/auth/app:single", creds)
    assert info.platforms == (Platform("linux", "s390x"),)
    gets = _manifest_gets(proxy)
    assert [(g.status, "authorization" in g.headers) for g in gets] == [
        (401, False),
        (200, True),
    ]
    assert len(ts.token_requests()) - tokens_before == 1
    # The fresh challenge is remembered: the next lookup needs neither a 401 nor a token.
    proxy.reset_requests()
    await insp.inspect(f"{proxy.host}/auth/app:v1", creds, pull_always=True)
    assert [r.status for r in proxy.seen] == [200]
    assert len(ts.token_requests()) - tokens_before == 1


async def test_a_token_rejected_under_a_changed_realm_is_fetched_from_the_new_realm(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:

    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    new_realm = fault_proxy(ts.url, ca_pem=token_registry.ca_pem)  # type: ignore[operator]
    insp, creds = await _through(proxy, token_registry, make_inspector)
    await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    # The registry rejects the cached token once and names another realm.
    proxy.add_rule(
        path_regex="/manifests/",
        status=401,
        headers=_bearer(f"{new_realm.url}/token", ts.service, "auth/app"),
        times=1,
    )
    proxy.reset_requests()
    info = await insp.inspect(f"{proxy.host}/auth/app:single", creds)
    assert info.platforms == (Platform("linux", "s390x"),)
    assert new_realm.count("GET", "^/token$") == 1
    assert [g.status for g in _manifest_gets(proxy)] == [401, 200]


async def test_a_registry_that_keeps_refusing_is_rechallenged_only_once(
    token_registry: Registry,
    token_images: None,
    fault_proxy: object,
    make_inspector: InspectorFactory,
) -> None:

    ts = token_registry.token_server
    assert ts is not None
    proxy = fault_proxy(token_registry)  # type: ignore[operator]
    insp, creds = await _through(proxy, token_registry, make_inspector)
    await insp.inspect(f"{proxy.host}/auth/app:v1", creds)
    # Every manifest request is now refused with the registry's (valid) challenge.
    proxy.add_rule(
        path_regex="/manifests/",
        status=401,
        headers=_bearer(ts.realm, ts.service, "auth/app"),
        times=0,
    )
    tokens_before = len(ts.token_requests())
    proxy.reset_requests()
    with pytest.raises(Unauthorized) as info:
        await insp.inspect(f"{proxy.host}/auth/app:single", creds)
    assert info.value.status == 401
    # With the credentials: the cached token (401), then one fresh token and one retry (401).
    # Anonymous (tried last): the token server refuses, one re-challenge (401), done.
    assert [("authorization" in g.headers) for g in _manifest_gets(proxy)] == [
        True,
        True,
        False,
    ]
    assert [r.username for r in ts.token_requests()[tokens_before:]] == [
        token_registry.username,
        None,
    ]
