"""The console script's dispatcher and logging."""

import json
import logging

import pytest

from podplacement import cli
from podplacement.logs import JSONFormatter, setup_logging


def test_no_subcommand_is_one_error_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("podplacement: error: a command is required: webhook, controller, certs, "
                   "inspect, explain, demo, version (see 'podplacement --help')\n")


def test_certs_generate_help_says_a_name_is_required(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["certs", "generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "at least one of --dns, --ip or --service is required" in text


def test_json_formatter_emits_one_object_with_extras() -> None:
    record = logging.LogRecord("x", logging.WARNING, "f", 1, "hello %s", ("pod",), None)
    record.pod = "ns/name"
    out = json.loads(JSONFormatter().format(record))
    assert out["msg"] == "hello pod"
    assert out["level"] == "warning"
    assert out["pod"] == "ns/name"


def test_unknown_log_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        setup_logging("loud")


# --- issue 15: help texts, one-line usage errors, the kubectl plugin's dispatch --------------

def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_texts_give_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help(capsys)
    assert "--log-format {json,text} log lines on stderr" in top and "(default: json)" in top
    assert "(default: info)" in top
    controller = _help(capsys, "controller")
    assert "concurrent pod reconciles, >= 1 (default: 32)" in controller
    assert "0 for unlimited (default: 500.0)" in controller
    assert "leader election lease duration in seconds" in controller
    assert "(default: 15)" in controller
    explain = _help(capsys, "explain")
    assert "report format: table, json, yaml (default: table)" in explain
    for flag in ("--pull-secret", "--ca-file", "--registries-conf", "--insecure-registry",
                 "--context", "--namespace"):
        assert flag in explain


@pytest.mark.parametrize("argv", [["--log-level", "loud", "inspect", "x"],
                                  ["controller", "--workers", "0"],
                                  ["controller", "--lease-duration", "-3"],
                                  ["nosuchcommand"]])
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "error:" in err and "--help" in err


def test_unexpected_errors_are_one_line(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from podplacement.imageinspect import cli as imageinspect_cli

    def boom(args: object) -> int:
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(imageinspect_cli, "run", boom)
    assert cli.main(["inspect", "nginx"]) == 1
    err = capsys.readouterr().err
    assert err == "podplacement inspect: RuntimeError: disk on fire second line\n"


def test_kubectl_plugin_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.kubectl_plugin(["--help"]) == 0
    assert "kubectl podplacement explain (pod/NAME | NAME | -f POD.yaml)" in \
        capsys.readouterr().out
    assert cli.kubectl_plugin([]) == 2
    capsys.readouterr()
    assert cli.kubectl_plugin(["describe"]) == 2
    assert capsys.readouterr().err.startswith("kubectl podplacement: error: unknown command")
    assert cli.kubectl_plugin(["explain", "deploy/web"]) == 2
    assert "only pods can be explained" in capsys.readouterr().err
    assert cli.kubectl_plugin(["inspect", "UPPER/Case::bad"]) == 2
    assert "invalid image reference" in capsys.readouterr().err
