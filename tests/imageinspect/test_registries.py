"""registries.conf v2 parsing and pull-source resolution (containers-registries.conf(5))."""

from __future__ import annotations

from pathlib import Path

import pytest

from podplacement.imageinspect import (
    Blocked,
    RegistriesConfig,
    RegistriesConfigError,
    parse_reference,
)

CONF = """
unqualified-search-registries = ["docker.io"]

[[registry]]
prefix = "docker.io"
location = "docker.io"

[[registry.mirror]]
location = "mirror-a.local:5000"
insecure = true

[[registry.mirror]]
location = "mirror-b.local/hub"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "quay.io/evil"
blocked = true

[[registry]]
prefix = "example.com/team"
location = "internal.example.com:5000/mirror/team"
insecure = true

[[registry]]
prefix = "*.corp.example"
insecure = true
"""

D64 = "sha256:" + "cd" * 32


def _sources(conf: RegistriesConfig, image: str) -> list[tuple[str, bool, bool]]:
    return [
        (str(s.reference), s.insecure, s.mirror) for s in conf.pull_sources(parse_reference(image))
    ]


def test_mirrors_in_order_then_source_respecting_pull_from_mirror() -> None:
    conf = RegistriesConfig.from_toml(CONF)
    assert _sources(conf, "nginx:1") == [
        ("mirror-a.local:5000/library/nginx:1", True, True),
        ("docker.io/library/nginx:1", False, False),
    ]
    assert _sources(conf, f"nginx@{D64}") == [
        (f"mirror-a.local:5000/library/nginx@{D64}", True, True),
        (f"mirror-b.local/hub/library/nginx@{D64}", False, True),
        (f"docker.io/library/nginx@{D64}", False, False),
    ]


def test_location_rewrites_the_matched_prefix_only_at_a_boundary() -> None:
    conf = RegistriesConfig.from_toml(CONF)
    assert _sources(conf, "example.com/team/app:v2") == [
        ("internal.example.com:5000/mirror/team/app:v2", True, False)
    ]
    # "example.com/teamwork" does not start with the "example.com/team" boundary.
    assert _sources(conf, "example.com/teamwork/app") == [
        ("example.com/teamwork/app:latest", False, False)
    ]


def test_blocked_prefix_raises_blocked() -> None:
    conf = RegistriesConfig.from_toml(CONF)
    with pytest.raises(Blocked) as info:
        conf.pull_sources(parse_reference("quay.io/evil/miner:1"))
    assert "blocked" in str(info.value)
    assert info.value.reference == "quay.io/evil/miner:1"
    assert _sources(conf, "quay.io/good/app") == [("quay.io/good/app:latest", False, False)]


def test_wildcard_prefix_and_insecure_hosts() -> None:
    conf = RegistriesConfig.from_toml(CONF)
    assert _sources(conf, "r1.corp.example/app") == [("r1.corp.example/app:latest", True, False)]
    assert conf.is_insecure("mirror-a.local:5000")
    assert not conf.is_insecure("docker.io")
    extra = RegistriesConfig().with_insecure("127.0.0.1:5000")
    assert extra.is_insecure("127.0.0.1:5000")
    assert not extra.is_insecure("127.0.0.1:5001")


def test_longest_prefix_wins() -> None:
    conf = RegistriesConfig.from_toml(
        '[[registry]]\nprefix = "r.io"\nblocked = true\n'
        '[[registry]]\nprefix = "r.io/ok"\nlocation = "r.io/ok"\n'
    )
    assert _sources(conf, "r.io/ok/app") == [("r.io/ok/app:latest", False, False)]
    with pytest.raises(Blocked):
        conf.pull_sources(parse_reference("r.io/other/app"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[[registry", "not valid TOML"),
        ('[registries.search]\nregistries = ["x"]', "v1 format"),
        ('[[registry]]\nlocation = "x.io"\ninsecure = "yes"', "registry[0].insecure"),
        ("[[registry]]\nblocked = true", "needs location or prefix"),
        ('[[registry]]\nlocation = "https://x.io"', "URL scheme"),
        ('[[registry]]\nlocation = "x.io"\n[[registry.mirror]]\ninsecure = true', "mirror[0]"),
        (
            '[[registry]]\nlocation = "x.io"\n[[registry.mirror]]\nlocation = "m"\n'
            'pull-from-mirror = "sometimes"',
            "pull-from-mirror",
        ),
    ],
)
def test_bad_documents_name_the_field(text: str, needle: str) -> None:
    with pytest.raises(RegistriesConfigError) as info:
        RegistriesConfig.from_toml(text)
    assert needle in str(info.value)


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "registries.conf"
    path.write_text(CONF)
    assert len(RegistriesConfig.load(path).registries) == 4
