"""``podplacement inspect`` end to end against the real registry."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from podplacement import cli
from tests.harness.cli import one_line, run_cli
from tests.harness.oci import Pusher
from tests.harness.registry import Registry


@pytest.fixture(scope="module")
def cli_images(registry: Registry, basic_registry: Registry, pusher: object) -> None:
    pusher(registry).multiarch("cli/app", "v1", ["linux/amd64", "linux/arm64/v8"])  # type: ignore[operator]
    p: Pusher = pusher(basic_registry)  # type: ignore[operator]
    p.image("cli/private", "v1", architecture="s390x")


def test_json_output_and_exit_code_1_when_an_image_fails(
    registry: Registry, cli_images: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "inspect",
            "--json",
            "--insecure-registry",
            registry.host,
            f"{registry.host}/cli/app:v1",
            f"{registry.host}/cli/app:missing",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out[0]["platforms"] == ["linux/amd64", "linux/arm64/v8"]
    assert out[0]["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert out[0]["digest"].startswith("sha256:")
    assert out[1]["errorType"] == "NotFound" and "404" in out[1]["error"]


def test_text_output_with_pull_secret_and_ca_file(
    basic_registry: Registry,
    cli_images: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    auth = base64.b64encode(f"{basic_registry.username}:{basic_registry.password}".encode())
    config = {"auths": {basic_registry.host: {"auth": auth.decode()}}}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }
    secret_file = tmp_path / "secret.json"
    secret_file.write_text(json.dumps(secret))
    assert basic_registry.ca_pem is not None
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(basic_registry.ca_pem)
    image = f"{basic_registry.host}/cli/private:v1"
    code = cli.main(
        [
            "inspect",
            "--pull-secret",
            str(secret_file),
            "--ca-file",
            f"{basic_registry.host}={ca_file}",
            image,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == image
    assert "platforms:  linux/s390x" in out
    # Without the secret the same image fails with the registry and status in the message.
    code = cli.main(["inspect", "--ca-file", f"{basic_registry.host}={ca_file}", image])
    err = capsys.readouterr().err
    assert code == 1
    assert "Unauthorized" in err and basic_registry.host in err and "401" in err


def test_registries_conf_blocked(
    registry: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\nblocked = true\n')
    code = cli.main(["inspect", "--registries-conf", str(conf), f"{registry.host}/cli/app:v1"])
    assert code == 1
    assert "Blocked" in capsys.readouterr().err


def test_unusable_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "--ca-file", "no-equals-sign", "nginx"]) == 2
    assert cli.main(["inspect", "--pull-secret", str(tmp_path / "missing.json"), "nginx"]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_secrets_never_reach_the_logs(
    basic_registry: Registry, cli_images: None, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from podplacement.imageinspect import Credential, Inspector

    async def run() -> None:
        assert basic_registry.ca_pem is not None
        async with Inspector(ca_bundles={basic_registry.host: basic_registry.ca_pem}) as insp:
            cred = Credential(basic_registry.host, basic_registry.username or "", "hunter2-wrong")
            for _ in range(2):
                try:
                    await insp.inspect(f"{basic_registry.host}/cli/private:v1", [cred])
                except Exception as exc:
                    logging.getLogger("test").error("failed: %s %r", exc, exc)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(run())
    text = caplog.text
    assert "failed" in text
    assert "hunter2-wrong" not in text
    assert (
        base64.b64encode(f"{basic_registry.username}:hunter2-wrong".encode()).decode() not in text
    )


# --- issue 15: unusable arguments are one line on stderr, exit code 2 -------------------------



@pytest.mark.parametrize("image", ["UPPER/Case::bad", "", "nginx:bad tag", "a//b"])
def test_an_unparsable_reference_is_an_argument_error(
        image: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 127.0.0.1:1 would refuse connections: the reference must be refused before any request
    code, out, err = run_cli(["inspect", "--json", "nginx", image], capsys)
    assert code == 2 and out == ""
    assert one_line(err).startswith("podplacement inspect: invalid image reference: ")


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "ten"])
def test_timeout_must_be_a_finite_positive_number(value: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["inspect", "--timeout", value, "nginx"], capsys)
    assert code == 2
    assert "--timeout" in one_line(err)


def test_pull_secret_with_a_yaml_syntax_error_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "secret.yaml"
    bad.write_text("kind: Secret\ndata: {a: [1,\n  b: 2\n")
    code, _, err = run_cli(["inspect", "--pull-secret", str(bad), "nginx"], capsys)
    assert code == 2
    line = one_line(err)
    assert f"{bad}: YAML syntax error at line" in line and "column" in line


def test_ca_file_without_a_pem_certificate_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notpem = tmp_path / "ca.pem"
    notpem.write_text("hello")
    code, _, err = run_cli(["inspect", "--ca-file", f"reg.example={notpem}", "nginx"], capsys)
    assert code == 2
    assert "holds no PEM certificate" in one_line(err)
