"""``podplacement certs generate|rotate`` through the real console-script dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certs import read_dir
from podplacement import cli


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (ext.get_values_for_type(x509.DNSName),
            [str(a) for a in ext.get_values_for_type(x509.IPAddress)])


def test_generate_writes_a_verifiable_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    assert cli.main(["certs", "generate", "--out", str(out), "--dns", "webhook.local",
                     "--ip", "127.0.0.1", "--validity-days", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["dns"] == ["webhook.local"]
    state = read_dir(out)
    assert state.serving is not None
    cert = state.serving.certificate
    ca = x509.load_pem_x509_certificate(state.trusted_cas[0])
    cert.verify_directly_issued_by(ca)
    assert sans(cert) == (["webhook.local"], ["127.0.0.1"])
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime.days == 10


def test_generate_service_shortcut_and_rsa(tmp_path: Path) -> None:
    assert cli.main(["certs", "generate", "--out", str(tmp_path),
                     "--service", "podplacement-webhook", "--namespace", "podplacement-system",
                     "--key-type", "rsa"]) == 0
    cert = read_dir(tmp_path).serving.certificate  # type: ignore[union-attr]
    assert sans(cert)[0] == [
        "podplacement-webhook",
        "podplacement-webhook.podplacement-system",
        "podplacement-webhook.podplacement-system.svc",
        "podplacement-webhook.podplacement-system.svc.cluster.local",
    ]
    key = cert.public_key()
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == 2048


def test_generate_without_names_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["certs", "generate", "--out", str(tmp_path)]) == 2
    assert "--dns" in capsys.readouterr().err


def test_rotate_force_then_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["certs", "generate", "--out", str(tmp_path), "--dns", "a"]) == 0
    capsys.readouterr()
    assert cli.main(["certs", "rotate", "--dir", str(tmp_path), "--force"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["new_ca"] is True and forced["reissued_serving"] is False
    assert len(read_dir(tmp_path).trusted_cas) == 2
    assert cli.main(["certs", "rotate", "--dir", str(tmp_path), "--overlap-minutes", "0"]) == 0
    step2 = json.loads(capsys.readouterr().out)
    assert step2["reissued_serving"] is True and step2["new_ca"] is False


def test_rotate_unreadable_dir_fails(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a cert")
    (tmp_path / "tls.key").write_text("not a key")
    assert cli.main(["certs", "rotate", "--dir", str(tmp_path)]) == 1


def test_console_script_runs_generate(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "podplacement", "certs", "generate", "--out", str(tmp_path),
         "--dns", "x"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "tls.crt").exists()
