"""Kubelet image credential providers: the config, matchImages (the kubelet's own examples),
the exec protocol with a real plugin process of the suite's own (a Python script), its
bounds and timeout, the response cache (one run per cache key and duration), ServiceAccount-
token mode's isolation, and the real Basic-auth registry inspected with what the plugin
returns (placed, not the fallback)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from podplacement.imageinspect import (
    Credential,
    PodIdentity,
    ProviderConfigError,
    ProviderRunner,
    Unauthorized,
    load_provider_config,
    parse_provider_config,
)
from podplacement.imageinspect._credproviders import (
    CredentialProvider,
    ProviderResponseError,
    ResponseCache,
    build_request,
    entry_key,
    expiry,
    lookup_keys,
    merge_provider_credentials,
    parse_duration,
    parse_response,
    service_account_key,
)
from podplacement.imageinspect._provider_exec import PluginError, exec_plugin
from tests.harness.oci import Pusher
from tests.harness.registry import Registry
from tests.imageinspect.conftest import InspectorFactory, trust

V1 = "credentialprovider.kubelet.k8s.io/v1"

#: A provider plugin speaking the exec protocol: reads the request, appends it (one JSON
#: line) to $PLUGIN_LOG, answers from $PLUGIN_ANSWER (a JSON file) with the request's
#: apiVersion. Modes by $PLUGIN_MODE: "sleep" (never answers), "flood" (writes 4 MiB),
#: "fail" (exit 3 with a message on stderr).
PLUGIN = textwrap.dedent("""\
    #!{python}
    import json, os, sys, time
    request = json.load(sys.stdin)
    with open(os.environ["PLUGIN_LOG"], "a") as f:
        f.write(json.dumps(request) + "\\n")
    mode = os.environ.get("PLUGIN_MODE", "")
    if mode == "sleep":
        time.sleep(60)
    if mode == "flood":
        sys.stdout.write("x" * (4 << 20))
        sys.exit(0)
    if mode == "fail":
        sys.stderr.write("no credentials for you\\n")
        sys.exit(3)
    with open(os.environ["PLUGIN_ANSWER"]) as f:
        answer = json.load(f)
    answer.setdefault("apiVersion", request["apiVersion"])
    answer.setdefault("kind", "CredentialProviderResponse")
    json.dump(answer, sys.stdout)
""")


def write_plugin(bin_dir: Path, name: str = "test-provider") -> Path:
    """Install the suite's plugin as ``bin_dir/name`` (executable)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(PLUGIN.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def provider_doc(match: list[str], **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "test-provider", "matchImages": match,
                             "defaultCacheDuration": "10m", "apiVersion": V1}
    entry.update(extra)
    return {"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
            "providers": [entry]}


def runs(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def plugin_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    write_plugin(bin_dir)
    log, answer = tmp_path / "runs.jsonl", tmp_path / "answer.json"
    monkeypatch.setenv("PLUGIN_LOG", str(log))
    monkeypatch.setenv("PLUGIN_ANSWER", str(answer))
    return {"bin": bin_dir, "log": log, "answer": answer, "dir": tmp_path}


# --- the config ----------------------------------------------------------------------------

def test_config_parses_as_the_kubelet_reads_it() -> None:
    text = textwrap.dedent("""\
        apiVersion: kubelet.config.k8s.io/v1
        kind: CredentialProviderConfig
        providers:
        - name: ecr-credential-provider
          matchImages: ["*.dkr.ecr.*.amazonaws.com", "registry.io:8080/path"]
          defaultCacheDuration: 12h
          apiVersion: credentialprovider.kubelet.k8s.io/v1
          args: [get-credentials]
          env: [{name: AWS_PROFILE, value: temp}]
          tokenAttributes:
            serviceAccountTokenAudience: registry.example
            requireServiceAccount: true
            requiredServiceAccountAnnotationKeys: [example.com/role]
            optionalServiceAccountAnnotationKeys: [example.com/region]
        """)
    (p,) = load_provider_config(text)
    assert p.name == "ecr-credential-provider" and p.default_cache_duration == 12 * 3600
    assert p.args == ("get-credentials",) and p.env == (("AWS_PROFILE", "temp"),)
    assert p.token_attributes is not None
    assert p.token_attributes.audience == "registry.example"
    assert p.token_attributes.required_annotation_keys == ("example.com/role",)


@pytest.mark.parametrize(("change", "says"), [
    ({"name": "../bin/sh"}, "name"),
    ({"name": ".."}, "name"),
    ({"matchImages": []}, "matchImages"),
    ({"matchImages": ["https://registry.io"]}, "no scheme"),
    ({"defaultCacheDuration": None}, "defaultCacheDuration is required"),
    ({"defaultCacheDuration": "-1m"}, "negative"),
    ({"defaultCacheDuration": "ten minutes"}, "not a duration"),
    ({"apiVersion": "credentialprovider.kubelet.k8s.io/v2"}, "apiVersion"),
    ({"tokenAttributes": {"serviceAccountTokenAudience": "a"}}, "requireServiceAccount"),
    ({"tokenAttributes": {"requireServiceAccount": True}}, "serviceAccountTokenAudience"),
    ({"apiVersion": "credentialprovider.kubelet.k8s.io/v1beta1",
      "tokenAttributes": {"serviceAccountTokenAudience": "a", "requireServiceAccount": True}},
     "needs apiVersion"),
])
def test_bad_config_is_one_line_naming_the_field(change: dict[str, Any], says: str) -> None:
    doc = provider_doc(["registry.io"])
    doc["providers"][0].update(change)
    with pytest.raises(ProviderConfigError) as info:
        parse_provider_config(doc)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_duplicate_names_and_wrong_kind_are_refused() -> None:
    doc = provider_doc(["registry.io"])
    doc["providers"].append(dict(doc["providers"][0]))
    with pytest.raises(ProviderConfigError, match="twice"):
        parse_provider_config(doc)
    with pytest.raises(ProviderConfigError, match="kind"):
        parse_provider_config({**provider_doc(["a.io"]), "kind": "KubeletConfiguration"})
    with pytest.raises(ProviderConfigError, match="not YAML"):
        load_provider_config("providers: [")


def test_durations_follow_go() -> None:
    assert parse_duration("0") == 0 and parse_duration("0s") == 0
    assert parse_duration("1h30m") == 5400 and parse_duration("500ms") == 0.5
    assert parse_duration("1.5h") == 5400


# --- matchImages: the examples of "Configure a kubelet image credential provider" ----------

@pytest.mark.parametrize(("pattern", "image", "matches"), [
    ("123456789.dkr.ecr.us-east-1.amazonaws.com",
     "123456789.dkr.ecr.us-east-1.amazonaws.com/foo/bar", True),
    ("*.azurecr.io", "example.azurecr.io/foo/bar", True),
    ("gcr.io", "gcr.io/foo/bar", True),
    ("*.*.registry.io", "foo.bar.registry.io/foo/bar", True),
    ("foo.registry.io:8080/path", "foo.registry.io:8080/path/foo/bar", True),
    # each * is one label: *.io does not match a.k8s.io
    ("*.io", "foo.k8s.io/app", False),
    ("*.k8s.io", "k8s.io/app", False),
    ("k8s.*", "k8s.io/app", True),
    ("app*.k8s.io", "app2.k8s.io/x", True),
    # the port must be equal, the path a prefix
    ("registry.io:8080", "registry.io/app", False),
    ("registry.io", "registry.io:8080/app", False),
    ("registry.io/team-a", "registry.io/team-b/app", False),
])
def test_match_images_globs_as_the_kubelet(pattern: str, image: str, matches: bool) -> None:
    p = CredentialProvider("p", (pattern,), 0.0, V1)
    assert p.applies_to(image) is matches


# --- the response, cache keys, merging -----------------------------------------------------

def answer(key_type: str = "Registry", duration: str | None = None,
           auth: Mapping[str, Any] | None = None) -> bytes:
    doc: dict[str, Any] = {"apiVersion": V1, "kind": "CredentialProviderResponse",
                           "cacheKeyType": key_type,
                           "auth": auth if auth is not None else
                           {"registry.io": {"username": "u", "password": "p"}}}
    if duration is not None:
        doc["cacheDuration"] = duration
    return json.dumps(doc).encode()


def test_response_is_checked_and_never_quoted() -> None:
    r = parse_response(answer(duration="5m", auth={
        "https://registry.io/v1/": {"username": "u", "password": "secret-x"}}), V1)
    assert r.cache_key_type == "Registry" and r.cache_duration == 300
    assert [c.pattern for c in r.credentials] == ["registry.io"]
    assert "secret-x" not in repr(r)
    for bad in (b"not json", answer("Pod"), answer().replace(b"Response", b"Request"),
                json.dumps({"apiVersion": "credentialprovider.kubelet.k8s.io/v1beta1",
                            "kind": "CredentialProviderResponse",
                            "cacheKeyType": "Image"}).encode(),
                answer(auth={"registry.io": {"username": 1, "password": "secret-x"}})):
        with pytest.raises(ProviderResponseError) as info:
            parse_response(bad, V1)
        assert "secret-x" not in str(info.value)
    with pytest.raises(ProviderResponseError, match="larger"):
        parse_response(b" " * (2 << 20), V1)


def test_cache_keys_by_type_and_expiry() -> None:
    image = "registry.io:5000/team/app"
    reg = parse_response(answer("Registry"), V1)
    img = parse_response(answer("Image"), V1)
    glob = parse_response(answer("Global"), V1)
    keys = lookup_keys(image)
    assert entry_key(img, image) == keys[0]
    assert entry_key(reg, image) == keys[1] and "registry.io:5000" in keys[1]
    assert entry_key(glob, image) == keys[2]
    # duration: the answer's, else the provider's default; 0 either way: not cached
    assert expiry(parse_response(answer(duration="1m"), V1), 600, 0) == 60
    assert expiry(reg, 600, 0) == 600
    assert expiry(reg, 0, 0) is None
    assert expiry(parse_response(answer(duration="0s"), V1), 600, 0) is None
    # the ServiceAccount part keeps namespaces and accounts apart, unambiguously
    a = service_account_key("team-a", "builder", "uid-1", {})
    b = service_account_key("team-b", "builder", "uid-1", {})
    assert a != b and lookup_keys(image, a) != lookup_keys(image, b)
    assert service_account_key("ab", "c", "", {}) != service_account_key("a", "bc", "", {})


def test_response_cache_lookup_order_and_expiry() -> None:
    cache = ResponseCache()
    creds = (Credential("registry.io", "u", "p"),)
    cache.put(entry_key(parse_response(answer("Registry"), V1), "registry.io/a"), creds, 10, 0)
    assert cache.get("registry.io/b", "", 5) == creds          # same registry
    assert cache.get("other.io/b", "", 5) is None
    assert cache.get("registry.io/b", "sa", 5) is None          # another ServiceAccount
    assert cache.get("registry.io/b", "", 10) is None           # expired


def test_earlier_provider_wins_on_the_same_key() -> None:
    first = [Credential("registry.io", "first", "1")]
    second = [Credential("registry.io", "second", "2"), Credential("registry.io/org", "s", "3")]
    merged = merge_provider_credentials([first, second])
    assert [(c.pattern, c.username) for c in merged] == [("registry.io", "first"),
                                                        ("registry.io/org", "s")]


def test_request_carries_token_only_in_token_mode() -> None:
    assert json.loads(build_request(V1, "registry.io/app")) == {
        "apiVersion": V1, "kind": "CredentialProviderRequest", "image": "registry.io/app"}
    doc = json.loads(build_request(V1, "r.io/a", token="t", annotations={"k": "v"}))
    assert doc["serviceAccountToken"] == "t" and doc["serviceAccountAnnotations"] == {"k": "v"}


# --- the exec, with the suite's plugin -----------------------------------------------------

async def test_exec_times_out_and_kills_the_plugin(
        plugin_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGIN_MODE", "sleep")
    started = time.monotonic()
    with pytest.raises(PluginError, match="did not answer"):
        await exec_plugin(str(plugin_env["bin"] / "test-provider"), [], [],
                          build_request(V1, "r.io/a"), limit_seconds=1.0)
    assert time.monotonic() - started < 30  # killed, not waited for (60 s sleep)


async def test_exec_bounds_output_and_reports_exit_status(
        plugin_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(plugin_env["bin"] / "test-provider")
    monkeypatch.setenv("PLUGIN_MODE", "flood")
    with pytest.raises(PluginError, match="more than"):
        await exec_plugin(path, [], [], build_request(V1, "r.io/a"), max_output=1 << 20)
    monkeypatch.setenv("PLUGIN_MODE", "fail")
    with pytest.raises(PluginError, match="status 3: no credentials for you"):
        await exec_plugin(path, [], [], build_request(V1, "r.io/a"))


async def test_runner_runs_once_per_cache_key_within_the_duration(
        plugin_env: dict[str, Path]) -> None:
    plugin_env["answer"].write_text(answer("Registry", "1h").decode())
    (provider,) = parse_provider_config(provider_doc(["registry.io"]))
    runner = ProviderRunner([provider], str(plugin_env["bin"]))
    one = await runner.credentials("registry.io/team/a")
    two = await runner.credentials("registry.io/team/b")
    assert one == two == [Credential("registry.io", "u", "p")]
    assert [r["image"] for r in runs(plugin_env["log"])] == ["registry.io/team/a"]
    assert await runner.credentials("elsewhere.io/team/a") == []  # no matchImages: no run
    assert runner.runs == {"test-provider": 1}


async def test_runner_with_image_keys_and_no_cache(plugin_env: dict[str, Path]) -> None:
    (provider,) = parse_provider_config(provider_doc(["registry.io"]))
    runner = ProviderRunner([provider], str(plugin_env["bin"]))
    plugin_env["answer"].write_text(answer("Image").decode())
    await runner.credentials("registry.io/a")
    await runner.credentials("registry.io/a")
    await runner.credentials("registry.io/b")
    assert len(runs(plugin_env["log"])) == 2
    plugin_env["answer"].write_text(answer("Global", "0s").decode())
    await runner.credentials("registry.io/c")
    await runner.credentials("registry.io/c")
    assert len(runs(plugin_env["log"])) == 4


async def test_a_failing_plugin_gives_nothing_and_is_retried(
        plugin_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    (provider,) = parse_provider_config(provider_doc(["registry.io"]))
    results: list[tuple[str, str]] = []
    runner = ProviderRunner([provider], str(plugin_env["bin"]),
                            on_run=lambda n, r: results.append((n, r)))
    monkeypatch.setenv("PLUGIN_MODE", "fail")
    assert await runner.credentials("registry.io/a") == []
    monkeypatch.delenv("PLUGIN_MODE")
    plugin_env["answer"].write_text(answer().decode())
    assert len(await runner.credentials("registry.io/a")) == 1
    assert results == [("test-provider", "error"), ("test-provider", "ok")]


class FakeAccounts:
    """ServiceAccounts and tokens of a pretend API server (the real one: the realcluster
    module)."""

    def __init__(self) -> None:
        self.tokens: list[tuple[str, str, str]] = []

    async def account(self, namespace: str, name: str) -> tuple[str, Mapping[str, str]]:
        annotations = {"example.com/role": f"{namespace}-{name}"} if name != "plain" else {}
        return f"uid-{namespace}-{name}", annotations

    async def token(self, pod: PodIdentity, audience: str) -> str:
        self.tokens.append((pod.namespace, pod.service_account, audience))
        return f"token-of-{pod.namespace}-{pod.service_account}-{audience}"


async def test_token_mode_binds_credentials_to_the_service_account(
        plugin_env: dict[str, Path]) -> None:
    plugin_env["answer"].write_text(answer("Registry", "1h").decode())
    (provider,) = parse_provider_config(provider_doc(["registry.io"], tokenAttributes={
        "serviceAccountTokenAudience": "registry.io", "requireServiceAccount": True,
        "requiredServiceAccountAnnotationKeys": ["example.com/role"]}))
    accounts = FakeAccounts()
    runner = ProviderRunner([provider], str(plugin_env["bin"]), accounts=accounts)
    a1 = PodIdentity("team-a", "p1", "u1", "builder")
    a2 = PodIdentity("team-a", "p2", "u2", "builder")
    b1 = PodIdentity("team-b", "p1", "u3", "builder")
    assert len(await runner.credentials("registry.io/app", a1)) == 1
    assert len(await runner.credentials("registry.io/app", a2)) == 1   # cached for the SA
    assert len(await runner.credentials("registry.io/app", b1)) == 1   # its own run
    seen = runs(plugin_env["log"])
    assert [r["serviceAccountToken"] for r in seen] == [
        "token-of-team-a-builder-registry.io", "token-of-team-b-builder-registry.io"]
    assert seen[0]["serviceAccountAnnotations"] == {"example.com/role": "team-a-builder"}
    # no ServiceAccount with requireServiceAccount, or one that did not opt in: no run
    assert await runner.credentials("registry.io/app", PodIdentity("c", "p", "u", "")) == []
    assert await runner.credentials("registry.io/app",
                                    PodIdentity("c", "p", "u", "plain")) == []
    assert len(runs(plugin_env["log"])) == 2


# --- the real registry --------------------------------------------------------------------

@pytest.fixture(scope="module")
def private_images(basic_registry: Registry, pusher: object) -> None:
    p: Pusher = pusher(basic_registry)  # type: ignore[operator]
    p.multiarch("private/app", "v1", ["linux/amd64", "linux/arm64/v8"])
    p.multiarch("private/other", "v1", ["linux/amd64", "linux/s390x"])


async def test_a_private_image_is_inspected_with_the_plugins_credentials(
        basic_registry: Registry, private_images: None, make_inspector: InspectorFactory,
        plugin_env: dict[str, Path]) -> None:
    host = basic_registry.host
    plugin_env["answer"].write_text(answer("Registry", "1h", auth={
        host: {"username": basic_registry.username, "password": basic_registry.password}
    }).decode())
    config = plugin_env["dir"] / "config.yaml"
    config.write_text(json.dumps(provider_doc([host.split(":")[0] + ":" + host.split(":")[1]])))
    runner = ProviderRunner.from_files(str(config), str(plugin_env["bin"]))
    insp = await make_inspector(ca_bundles=trust(basic_registry))
    with pytest.raises(Unauthorized):
        await insp.inspect(f"{host}/private/app:v1")  # without: what main did
    info = await insp.inspect(f"{host}/private/app:v1",
                              await runner.credentials(f"{host}/private/app"))
    other = await insp.inspect(f"{host}/private/other:v1",
                               await runner.credentials(f"{host}/private/other"))
    assert [str(p) for p in info.platforms] == ["linux/amd64", "linux/arm64/v8"]
    assert [str(p) for p in other.platforms] == ["linux/amd64", "linux/s390x"]
    assert len(runs(plugin_env["log"])) == 1  # cacheKeyType Registry: one run for both


def test_from_files_reports_missing_binaries(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(provider_doc(["registry.io"])))
    (tmp_path / "bin").mkdir()
    with pytest.raises(ProviderConfigError, match="no executable"):
        ProviderRunner.from_files(str(config), str(tmp_path / "bin"))
    with pytest.raises(ProviderConfigError, match="does not exist"):
        ProviderRunner.from_files(str(config), str(tmp_path / "nope"))
    with pytest.raises(ProviderConfigError, match="cannot read"):
        ProviderRunner.from_files(str(tmp_path / "missing.yaml"), str(tmp_path / "bin"))
    assert os.path.exists(config)
