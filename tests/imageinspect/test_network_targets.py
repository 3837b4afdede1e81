"""Where a registry can send the inspector: token realms and redirects pass the registry's own
network checks, and no remote text reaches an error's message (docs/security.md, "The network
a registry can send us to"; DESIGN.md: "token realms and redirects pass the same network
checks as the registry, and no remote text is copied into what users read").

Hostile registries are fault proxies answering from rules (plain HTTP, or HTTPS with a CA of
the test's own); canaries are fault proxies that record what reaches them: one on 127.0.0.1,
one bound to 127.0.0.77, an address no other test double uses, refused as a network.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from podplacement.certs import generate_ca, issue_serving_cert
from podplacement.imageinspect import (
    DEFAULT_REFUSED_NETWORKS,
    ConnectionFailed,
    InvalidManifest,
    RefusedTarget,
    RegistriesConfig,
    RegistryError,
    Unauthorized,
    UnsafeAddress,
    parse_networks,
)
from podplacement.imageinspect._manifest import OCI_MANIFEST
from podplacement.imageinspect._transport import is_forbidden_address
from tests.harness.faults import FaultProxy
from tests.harness.registry import Registry
from tests.imageinspect.conftest import InspectorFactory, insecure

#: A distinctive string the hostile side puts in every body, header and realm it controls.
MARKER = "QX7-remote-text-marker"
FAR = "127.0.0.77"
ProxyFactory = Callable[..., FaultProxy]


def _bearer(realm: str) -> dict[str, str]:
    return {"WWW-Authenticate": f'Bearer realm="{realm}",service="{MARKER}"'}


@pytest.fixture(scope="module")
def tls() -> tuple[Any, bytes]:
    """A serving certificate for 127.0.0.1 and the PEM of the CA that signed it."""
    ca = generate_ca("network-targets-ca")
    return issue_serving_cert(ca, ["localhost"], ["127.0.0.1"]), ca.cert_pem


@pytest.fixture
def canary(fault_proxy: ProxyFactory) -> FaultProxy:
    """A token server on 127.0.0.1 that would grant anything (it records what reaches it)."""
    proxy = fault_proxy("http://127.0.0.1:9")
    proxy.add_rule(status=200, content_type="application/json",
                   body=json.dumps({"token": "granted"}).encode(), times=0)
    return proxy


@pytest.fixture
def far_canary(fault_proxy: ProxyFactory) -> FaultProxy:
    """The same on 127.0.0.77 (put in the refused networks by the tests)."""
    proxy = fault_proxy("http://127.0.0.1:9", bind=FAR)
    proxy.add_rule(status=200, content_type="application/json",
                   body=json.dumps({"token": "granted"}).encode(), times=0)
    return proxy


REFUSING_FAR = parse_networks([*DEFAULT_REFUSED_NETWORKS, f"{FAR}/32"])


# --- the address guard's networks ---------------------------------------------------------


@pytest.mark.parametrize("address", [
    "100.100.100.200", "168.63.129.16", "fd00:ec2::23", "fd00:ec2::253", "fd00:ec2::254",
    "169.254.169.254",
    "::ffff:100.100.100.200", "::ffff:168.63.129.16", "64:ff9b::a83f:8110",  # 168.63.129.16
    "2002:6464:64c8::1",  # 6to4 of 100.100.100.200
])
def test_the_clouds_metadata_addresses_are_refused_by_default(address: str) -> None:
    assert is_forbidden_address(address)


def test_refused_networks_are_configurable_and_cover_embedded_forms() -> None:
    nets = parse_networks(["10.1.0.0/16", "192.0.2.7", "2001:db8::/32"])
    assert [str(n) for n in nets] == ["10.1.0.0/16", "192.0.2.7/32", "2001:db8::/32"]
    for address in ("10.1.2.3", "::ffff:10.1.2.3", "64:ff9b::a01:203", "192.0.2.7",
                    "2001:db8::1"):
        assert is_forbidden_address(address, nets), address
    for address in ("10.2.0.1", "169.254.169.254", "127.0.0.1", "::1"):
        assert not is_forbidden_address(address, nets), address
    # loopback stays reachable by default (registries on the node, the tests' registries)
    assert not is_forbidden_address("127.0.0.1") and not is_forbidden_address("::1")


@pytest.mark.parametrize("items", [["not-a-network"], ["10.0.0.0/33"], ["x"] * 65])
def test_bad_refused_networks_raise_value_error(items: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_networks(items)


def test_blocked_hosts_of_registries_conf() -> None:
    conf = RegistriesConfig.from_toml(
        '[[registry]]\nlocation = "evil.example"\nblocked = true\n'
        '[[registry]]\nprefix = "*.bad.example"\nlocation = "x.example"\nblocked = true\n'
        '[[registry]]\nlocation = "ok.example/team"\nblocked = true\n')
    assert conf.blocks_host("evil.example") and conf.blocks_host("evil.example:5000")
    assert conf.blocks_host("auth.bad.example")
    assert not conf.blocks_host("ok.example") and not conf.blocks_host("evil.example.org")


# --- token realms -------------------------------------------------------------------------


async def test_plain_http_realm_of_a_registry_not_marked_insecure_is_refused(
    fault_proxy: ProxyFactory, canary: FaultProxy, tls: tuple[Any, bytes],
    make_inspector: InspectorFactory,
) -> None:
    """The attack: an HTTPS registry's realm names another port of 127.0.0.1 with a path
    and query of its choosing; nothing reaches that port."""
    serving, ca_pem = tls
    registry = fault_proxy("http://127.0.0.1:9", serving=serving)
    realm = f"http://{canary.host}/admin/{MARKER}"
    registry.add_rule(path_regex="^/v2/", status=401, headers=_bearer(realm), times=0)
    insp = await make_inspector(ca_bundles={registry.host: ca_pem}, retries=0)
    with pytest.raises(RefusedTarget) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert "plain HTTP" in str(info.value)
    assert MARKER not in str(info.value) and canary.host not in str(info.value)
    assert info.value.registry == registry.host
    assert canary.seen == []


@pytest.mark.parametrize(("realm", "why"), [
    ("http://user:pw@{canary}/token", "userinfo"),
    ("http://{canary}/token?next=/admin", "query string"),
    ("http://{canary}/token#x", "fragment"),
    ("ftp://{canary}/token", "not an http"),
    ("http://{canary}/tok en", "control characters"),
    ("http://{canary}/" + "a" * 3000, "too long"),
])
async def test_realms_that_are_not_plain_token_urls_are_refused(
    realm: str, why: str, fault_proxy: ProxyFactory, canary: FaultProxy,
    make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(realm.format(canary=canary.host)), times=0)
    insp = await make_inspector(registries=insecure(registry.host, canary.host), retries=0)
    with pytest.raises(RefusedTarget, match=why) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert canary.host not in str(info.value)
    assert canary.seen == []


async def test_a_plain_realm_of_an_insecure_registry_gets_only_the_protocols_query(
    fault_proxy: ProxyFactory, canary: FaultProxy, make_inspector: InspectorFactory,
) -> None:
    """What stays allowed: the admin marked the registry insecure; the token server gets
    the realm's path and the token protocol's own query (service, scope), nothing else."""
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(f"http://{canary.host}/token"), times=1)
    registry.add_rule(path_regex="^/v2/", status=404, times=0)
    insp = await make_inspector(registries=insecure(registry.host), retries=0)
    with pytest.raises(RegistryError):
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert [(r.method, r.path) for r in canary.seen] == [("GET", "/token")]
    query = canary.seen[0].target.split("?", 1)[1]
    assert sorted(p.split("=")[0] for p in query.split("&")) == ["scope", "service"]


async def test_a_realm_on_a_host_registries_conf_blocks_is_refused(
    fault_proxy: ProxyFactory, canary: FaultProxy, make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(f"http://{canary.host}/token"), times=0)
    conf = RegistriesConfig.from_toml(
        f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n'
        f'[[registry]]\nlocation = "{canary.host}"\nblocked = true\n')
    insp = await make_inspector(registries=conf, retries=0)
    with pytest.raises(RefusedTarget, match=r"blocked by registries\.conf"):
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert canary.seen == []


async def test_a_realm_in_a_refused_network_is_not_connected_to(
    fault_proxy: ProxyFactory, far_canary: FaultProxy, make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(f"http://{far_canary.host}/token"), times=0)
    conf = insecure(registry.host)
    insp = await make_inspector(registries=conf, retries=0, refused_networks=REFUSING_FAR)
    with pytest.raises(UnsafeAddress) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert FAR not in str(info.value) and info.value.registry == registry.host
    assert far_canary.seen == []
    # The control: with the default networks the same realm is reached (the canary works).
    other = await make_inspector(registries=conf, retries=0)
    with pytest.raises(RegistryError):
        await other.inspect(f"{registry.host}/team/app:v1")
    assert far_canary.seen != []


async def test_a_token_that_is_not_a_header_value_is_unauthorized(
    fault_proxy: ProxyFactory, canary: FaultProxy, make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(f"http://{canary.host}/token"), times=0)
    canary.clear_rules()
    canary.add_rule(status=200, content_type="application/json", times=0,
                    body=json.dumps({"token": f"ok\r\nX-Injected: {MARKER}"}).encode())
    insp = await make_inspector(registries=insecure(registry.host), retries=0)
    with pytest.raises(Unauthorized, match="no usable token") as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert MARKER not in str(info.value)
    assert all("x-injected" not in r.headers for r in registry.seen)


# --- redirects ----------------------------------------------------------------------------


@pytest.fixture
def single(registry: Registry, pusher: Any) -> str:
    """A single-platform image (its platform is in the config blob: one blob fetch)."""
    pusher(registry).image("net/single", "v1", architecture="arm64")
    return "net/single:v1"


async def test_a_blob_redirect_into_a_refused_network_is_not_followed(
    registry: Registry, single: str, fault_proxy: ProxyFactory, far_canary: FaultProxy,
    make_inspector: InspectorFactory,
) -> None:
    proxy = fault_proxy(registry)
    proxy.add_rule(path_regex="/blobs/", redirect_to=far_canary.url, times=0)
    conf = insecure(proxy.host)
    insp = await make_inspector(registries=conf, retries=0, refused_networks=REFUSING_FAR)
    with pytest.raises(UnsafeAddress) as info:
        await insp.inspect(f"{proxy.host}/{single}")
    assert FAR not in str(info.value) and info.value.registry == proxy.host
    assert far_canary.seen == []
    other = await make_inspector(registries=conf, retries=0)  # the control
    with pytest.raises(RegistryError):
        await other.inspect(f"{proxy.host}/{single}")
    assert far_canary.seen != []


async def test_a_plain_http_redirect_of_a_tls_registry_is_refused(
    registry: Registry, single: str, fault_proxy: ProxyFactory, canary: FaultProxy,
    tls: tuple[Any, bytes], make_inspector: InspectorFactory,
) -> None:
    serving, ca_pem = tls
    proxy = fault_proxy(registry, serving=serving)
    proxy.add_rule(path_regex="/blobs/", redirect_to=f"{canary.url}/{MARKER}", times=0)
    insp = await make_inspector(ca_bundles={proxy.host: ca_pem}, retries=0)
    with pytest.raises(RefusedTarget, match="redirect refused: plain HTTP") as info:
        await insp.inspect(f"{proxy.host}/{single}")
    assert MARKER not in str(info.value) and canary.host not in str(info.value)
    assert canary.seen == []


async def test_a_config_digest_that_is_not_a_digest_is_never_put_in_a_url(
    fault_proxy: ProxyFactory, make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": f"sha256:../../../admin?{MARKER}", "size": 2}}
    registry.add_rule(path_regex="/manifests/", status=200, content_type=OCI_MANIFEST,
                      body=json.dumps(manifest).encode(), times=0)
    insp = await make_inspector(registries=insecure(registry.host), retries=0)
    with pytest.raises(InvalidManifest) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert MARKER not in str(info.value)
    assert [r.path for r in registry.seen if "/manifests/" not in r.path] == []


# --- no remote text in errors -------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 418, 500, 502])
async def test_the_registrys_error_bodies_are_not_in_the_error(
    status: int, fault_proxy: ProxyFactory, make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    body = json.dumps({"errors": [{"code": MARKER, "message": f"{MARKER} internal detail"}]})
    registry.add_rule(path_regex="^/v2/", status=status, content_type="application/json",
                      body=body.encode(), times=0)
    insp = await make_inspector(registries=insecure(registry.host), retries=0)
    with pytest.raises(RegistryError) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    assert MARKER not in str(info.value)
    assert info.value.status == status


@pytest.mark.parametrize("status", [400, 401, 403, 500])
async def test_the_token_servers_answers_are_not_in_the_error(
    status: int, fault_proxy: ProxyFactory, canary: FaultProxy,
    make_inspector: InspectorFactory,
) -> None:
    registry = fault_proxy("http://127.0.0.1:9")
    registry.add_rule(path_regex="^/v2/", status=401,
                      headers=_bearer(f"http://{canary.host}/{MARKER}"), times=0)
    canary.clear_rules()
    body = json.dumps({"errors": [{"code": MARKER, "message": MARKER}], "details": MARKER})
    canary.add_rule(status=status, content_type="application/json", body=body.encode(),
                    times=0)
    insp = await make_inspector(registries=insecure(registry.host), retries=0)
    with pytest.raises(RegistryError) as info:
        await insp.inspect(f"{registry.host}/team/app:v1")
    text = str(info.value)
    assert MARKER not in text and canary.host not in text


@pytest.fixture
def banner() -> Iterator[str]:
    """A TCP service on 127.0.0.1 that is not HTTP: it sends a banner and hangs up (an SSH
    or SMTP server found by a scan)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(f"SSH-2.0-{MARKER}\r\n".encode())
                # read what the client sends, so it sees the banner before the close
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    server.close()


async def test_a_services_banner_is_not_in_the_error(
    banner: str, make_inspector: InspectorFactory,
) -> None:
    insp = await make_inspector(registries=insecure(banner), retries=0)
    with pytest.raises(ConnectionFailed) as info:
        await insp.inspect(f"{banner}/team/app:v1")
    assert MARKER not in str(info.value) and "SSH" not in str(info.value)


async def test_a_layer_redirect_into_a_refused_network_is_not_followed(
    registry: Registry, pusher: Any, fault_proxy: ProxyFactory, far_canary: FaultProxy,
    make_inspector: InspectorFactory,
) -> None:
    """The layer stream of ``verify_image`` (the exec-format monitor's check) follows
    redirects through the same checks."""
    from podplacement.imageinspect import verify_image

    p = pusher(registry)
    p.image("net/verify", "v1", architecture="arm64", process={"Entrypoint": ["/bin/app"]})
    manifest = p.get_manifest("net/verify", "v1").json()
    layer = manifest["layers"][0]["digest"]
    proxy = fault_proxy(registry)
    proxy.add_rule(path_regex=f"/blobs/{layer}", redirect_to=far_canary.url, times=0)
    insp = await make_inspector(registries=insecure(proxy.host), retries=0,
                                refused_networks=REFUSING_FAR)
    report = await verify_image(insp, f"{proxy.host}/net/verify:v1")
    assert [p.status for p in report.platforms] == ["error"]
    assert FAR not in report.platforms[0].reason
    assert proxy.count("GET", f"/blobs/{layer}") == 1
    assert far_canary.seen == []
