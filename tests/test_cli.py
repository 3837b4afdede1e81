"""The console script's dispatcher and logging."""

import json
import logging

import pytest

from podplacement import cli
from podplacement.logs import JSONFormatter, setup_logging


def test_no_subcommand_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: podplacement" in capsys.readouterr().out


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
