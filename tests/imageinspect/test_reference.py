"""Reference grammar and kubelet normalisation (distribution/reference, ParseNormalizedNamed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from podplacement.imageinspect import InvalidReference, Reference, parse_reference

D64 = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:1.27", "docker.io/library/nginx:1.27"),
        ("library/nginx", "docker.io/library/nginx:latest"),
        ("bitnami/redis:7", "docker.io/bitnami/redis:7"),
        ("docker.io/nginx", "docker.io/library/nginx:latest"),
        ("index.docker.io/library/nginx", "docker.io/library/nginx:latest"),
        ("ghcr.io/org/app:v1", "ghcr.io/org/app:v1"),
        ("localhost/app", "localhost/app:latest"),
        ("localhost:5000/a/b/c:t", "localhost:5000/a/b/c:t"),
        ("127.0.0.1:5000/x", "127.0.0.1:5000/x:latest"),
        ("[::1]:5000/x:y", "[::1]:5000/x:y"),
        (f"nginx@{D64}", f"docker.io/library/nginx@{D64}"),
        (f"nginx:1.27@{D64}", f"docker.io/library/nginx:1.27@{D64}"),
        ("a.b/c__d/e-f--g/h.i:Tag_1.x-y", "a.b/c__d/e-f--g/h.i:Tag_1.x-y"),
    ],
)
def test_normalises_like_the_kubelet(image: str, expected: str) -> None:
    assert str(parse_reference(image)) == expected


def test_docker_hub_uses_its_api_endpoint() -> None:
    ref = parse_reference("nginx")
    assert ref.domain == "docker.io"
    assert ref.api_host == "registry-1.docker.io"
    assert parse_reference("quay.io/a/b").api_host == "quay.io"


def test_digest_decides_when_tag_and_digest_are_given() -> None:
    ref = parse_reference(f"nginx:1.27@{D64}")
    assert ref.manifest_ref == D64
    assert ref.pinned
    assert parse_reference("nginx:1.27").manifest_ref == "1.27"
    assert parse_reference(f"nginx@{D64}").tag is None


@pytest.mark.parametrize(
    ("image", "part"),
    [
        ("", "reference"),
        (" nginx", "reference"),
        ("Nginx", "path"),
        ("ghcr.io/Org/app", "path"),
        ("ghcr.io/org//app", "path"),
        ("ghcr.io/org/app-", "path"),
        ("nginx:-bad", "tag"),
        ("nginx:" + "a" * 129, "tag"),
        ("nginx@sha256:abc", "digest"),
        ("nginx@md5:" + "a" * 32, "digest"),
        ("nginx@sha256:" + "G" * 64, "digest"),
        ("exa_mple.com/app", "domain"),
        ("-bad.com/app", "domain"),
        ("example.com:port/app", "port"),
        ("ab" * 32, "path"),
        ("example.com/" + "a" * 250, "reference"),
        (":tag", "path"),
    ],
)
def test_invalid_reference_names_the_bad_part(image: str, part: str) -> None:
    with pytest.raises(InvalidReference) as info:
        parse_reference(image)
    assert info.value.part == part
    assert info.value.reference == image


_alnum = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
_sep = st.sampled_from([".", "_", "__", "-", "--"])


@st.composite
def _path_component(draw: st.DrawFn) -> str:
    parts = [draw(_alnum)]
    for _ in range(draw(st.integers(0, 2))):
        parts += [draw(_sep), draw(_alnum)]
    return "".join(parts)


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,5}[a-z0-9])?", fullmatch=True)


@st.composite
def _domain(draw: st.DrawFn) -> str:
    labels = [draw(_label) for _ in range(draw(st.integers(1, 3)))]
    host = ".".join(labels)
    if len(labels) == 1 and host != "localhost":
        host += ".io"  # a single label without '.' or ':' would be a Docker Hub path
    if draw(st.booleans()):
        host += f":{draw(st.integers(1, 65535))}"
    return host


@st.composite
def _reference(draw: st.DrawFn) -> Reference:
    domain = draw(_domain())
    path = "/".join(draw(st.lists(_path_component(), min_size=1, max_size=3)))
    tag = draw(st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True))
    digest = draw(st.none() | st.from_regex(r"sha256:[a-f0-9]{64}", fullmatch=True))
    if tag is None and digest is None:
        tag = "latest"
    return Reference(domain, path, tag, digest)


@given(_reference())
def test_format_then_parse_round_trips(ref: Reference) -> None:
    assert parse_reference(str(ref)) == ref


@given(st.text(max_size=40))
def test_parse_is_idempotent_or_raises_a_typed_error(text: str) -> None:
    try:
        ref = parse_reference(text)
    except InvalidReference as exc:
        assert exc.part in {"domain", "port", "path", "tag", "digest", "reference"}
        return
    assert parse_reference(str(ref)) == ref
