"""Challenge parsing and token requests/responses (Docker registry token authentication)."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import pytest

from podplacement.imageinspect import Credential
from podplacement.imageinspect._auth import (
    Challenge,
    basic_header,
    parse_challenges,
    parse_token_response,
    pull_scope,
    token_request,
)


def test_parse_bearer_and_basic_challenges() -> None:
    got = parse_challenges(
        [
            'Basic realm="Registry Realm"',
            'Bearer realm="https://auth.example/token",service="reg, the service",'
            'scope="repository:a/b:pull",error="insufficient_scope"',
        ]
    )
    assert got[0] == Challenge(
        "bearer",
        "https://auth.example/token",
        "reg, the service",
        "repository:a/b:pull",
        "insufficient_scope",
    )
    assert got[1] == Challenge("basic", "Registry Realm")
    assert parse_challenges(["Bearer realm=https://x/t, service=s"])[0].service == "s"
    assert parse_challenges([""]) == []


def test_token_request_variants() -> None:
    ch = Challenge("bearer", "https://auth.example/token?x=1", "svc")
    anon = token_request(ch, pull_scope("a/b"), None)
    assert anon.method == "GET" and "Authorization" not in anon.headers
    query = parse_qs(urlsplit(anon.url).query)
    assert query == {"x": ["1"], "service": ["svc"], "scope": ["repository:a/b:pull"]}

    basic = token_request(ch, "s", Credential("r", "user", "pw"))
    assert basic.headers["Authorization"] == basic_header(Credential("r", "user", "pw"))
    assert base64.b64decode(basic.headers["Authorization"][6:]) == b"user:pw"

    refresh = token_request(ch, "s", Credential("r", identity_token="rt"))
    assert refresh.method == "POST" and refresh.body is not None
    form = parse_qs(refresh.body.decode())
    assert form["grant_type"] == ["refresh_token"] and form["refresh_token"] == ["rt"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"token": "t1", "expires_in": 300}', ("t1", 300.0)),
        (b'{"access_token": "t2"}', ("t2", 60.0)),
        (b'{"token": "t3", "access_token": "t4", "expires_in": 0}', ("t3", 60.0)),
    ],
)
def test_token_responses(body: bytes, expected: tuple[str, float]) -> None:
    assert parse_token_response(body) == expected


@pytest.mark.parametrize("body", [b"nope", b"[]", b'{"expires_in": 5}', b'{"token": ""}'])
def test_bad_token_responses(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_token_response(body)
