"""Credential parsing (pull secrets, docker config) and the kubelet's matching rules."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from podplacement.imageinspect import (
    Credential,
    CredentialError,
    credentials_from_docker_config,
    credentials_from_pull_secrets,
    match_credentials,
)
from podplacement.imageinspect._credentials import normalize_key, urls_match


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _secret(kind: str, key: str, payload: dict[str, Any], name: str = "s") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "ns"},
        "type": kind,
        "data": {key: _b64(json.dumps(payload))},
    }


def test_dockerconfigjson_and_legacy_dockercfg_secrets() -> None:
    secrets = [
        _secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            {"auths": {"https://index.docker.io/v1/": {"auth": _b64("hub:pw:with:colons")}}},
        ),
        _secret(
            "kubernetes.io/dockercfg",
            ".dockercfg",
            {"quay.io": {"username": "q", "password": "qp", "email": "x@y"}},
        ),
        {"type": "Opaque", "data": {"x": _b64("{}")}},
    ]
    creds = credentials_from_pull_secrets(secrets)
    assert [(c.pattern, c.username, c.password) for c in creds] == [
        ("index.docker.io", "hub", "pw:with:colons"),
        ("quay.io", "q", "qp"),
    ]


def test_docker_config_identity_token_and_auth_wins_over_username() -> None:
    cfg = {
        "auths": {
            "ghcr.io": {"identitytoken": "refresh-me"},
            "r.example.com:5000/team": {"username": "u", "password": "p", "auth": _b64("a:b")},
            "empty.io": {},
        }
    }
    creds = credentials_from_docker_config(cfg)
    assert [(c.pattern, c.username, c.password, c.identity_token) for c in creds] == [
        ("ghcr.io", "", "", "refresh-me"),
        ("r.example.com:5000/team", "a", "b", ""),
    ]


def test_repr_and_identity_never_show_secrets() -> None:
    cred = Credential("quay.io", "user", "s3cr3t-password", "tok-3n")
    text = repr(cred) + str(cred)
    for secret in ("s3cr3t-password", "tok-3n", "user"):
        assert secret not in text.replace("quay.io", "")
    assert cred.identity == Credential("other.io", "user", "s3cr3t-password", "tok-3n").identity
    assert cred.identity != Credential("quay.io", "user", "other", "tok-3n").identity
    assert "s3cr3t" not in cred.identity


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"auths": {"x.io": "nope"}}, "not an object"),
        ({"auths": {"x.io": {"auth": "!!!"}}}, "x.io"),
        ({"auths": {"x.io": {"auth": _b64("nocolon")}}}, "user:password"),
    ],
)
def test_bad_docker_config_names_the_entry(bad: dict[str, Any], needle: str) -> None:
    with pytest.raises(CredentialError) as info:
        credentials_from_docker_config(bad)
    assert needle in str(info.value)


def test_bad_secret_payload_names_the_secret() -> None:
    secret = {
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "regcred"},
        "data": {".dockerconfigjson": _b64("not json")},
    }
    with pytest.raises(CredentialError, match="regcred"):
        credentials_from_pull_secrets([secret])


@pytest.mark.parametrize(
    ("key", "normal"),
    [
        ("https://index.docker.io/v1/", "index.docker.io"),
        ("http://quay.io/v2/", "quay.io"),
        ("quay.io/org/", "quay.io/org"),
        ("registry:5000", "registry:5000"),
    ],
)
def test_key_normalisation(key: str, normal: str) -> None:
    assert normalize_key(key) == normal


@pytest.mark.parametrize(
    ("glob", "target", "expected"),
    [
        ("*.example.com", "a.example.com/app", True),
        ("*.example.com", "example.com/app", False),
        ("*.example.com", "a.b.example.com/app", False),
        ("*.*.example.com", "a.b.example.com/app", True),
        ("reg?.io", "reg1.io/x", True),
        ("reg[0-9].io", "regx.io/x", False),
        ("example.com:5000", "example.com:5000/app", True),
        ("example.com:5000", "example.com/app", False),
        ("example.com", "example.com:5000/app", False),
        ("quay.io/org", "quay.io/org/app", True),
        ("quay.io/org", "quay.io/other/app", False),
        ("quay.io/org/app", "quay.io/org", False),
    ],
)
def test_urls_match_follows_the_kubelet(glob: str, target: str, expected: bool) -> None:
    assert urls_match(glob, target) is expected


def test_match_orders_most_specific_first_and_falls_back_to_docker_hub() -> None:
    broad = Credential("quay.io", "broad", "1")
    org = Credential("quay.io/org", "org", "2")
    org2 = Credential("quay.io/org", "org-second", "3")
    glob = Credential("*.quay.io", "glob", "4")
    hub = Credential("index.docker.io", "hub", "5")
    creds = [broad, org, org2, glob, hub]
    assert match_credentials("quay.io/org/app", creds) == [org, org2, broad]
    assert match_credentials("quay.io/x/app", creds) == [broad]
    assert match_credentials("eu.quay.io/x", creds) == [glob]
    assert match_credentials("docker.io/library/nginx", creds) == [hub]
    assert match_credentials("ghcr.io/x/y", creds) == []
    # Duplicates of one login collapse.
    assert match_credentials("quay.io/a", [broad, Credential("quay.io", "broad", "1")]) == [broad]


def test_legacy_map_skips_non_entry_settings() -> None:
    cfg = {"r.io": {"auth": _b64("u:p")}, "currentContext": "default", "credsStore": "x"}
    assert [c.pattern for c in credentials_from_docker_config(cfg)] == ["r.io"]
