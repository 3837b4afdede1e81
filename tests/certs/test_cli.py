"""``podplacement certs generate|rotate`` through the real console-script dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from podplacement import cli
from podplacement.certs import read_dir
from tests.harness.cli import one_line, run_cli


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


# --- issue 15: refusals are one line on stderr, exit code 2 ----------------------------------



def test_generate_refuses_to_replace_keys_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert run_cli(["certs", "generate", "--out", str(out), "--dns", "a.local"], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, stdout, err = run_cli(["certs", "generate", "--out", str(out), "--dns", "a.local"],
                                capsys)
    assert code == 2 and stdout == ""
    line = one_line(err)
    assert all(name in line for name in ("tls.crt", "tls.key", "ca.crt", "ca.key"))
    assert "--force" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing replaced
    code, _, err = run_cli(["certs", "generate", "--out", str(out), "--dns", "a.local",
                            "--force"], capsys)
    assert code == 0, err
    assert (out / "ca.key").read_bytes() != before["ca.key"]


def test_generate_into_an_empty_existing_directory_needs_no_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "unrelated.txt").write_text("x")
    assert run_cli(["certs", "generate", "--out", str(tmp_path), "--dns", "a"], capsys)[0] == 0


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_generate_out_that_cannot_be_a_directory(kind: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker if kind == "file" else blocker / "sub"
    code, _, err = run_cli(["certs", "generate", "--out", str(out), "--dns", "a"], capsys)
    assert code == 2
    assert str(out) in one_line(err)


@pytest.mark.parametrize("name", ["bad name!", "UPPER.example", "-lead.example", "a..b",
                                  "trail.", "*", "*.com", "a.*.b", "x" * 64, "under_score"])
def test_generate_refuses_names_that_are_not_dns_subdomains(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["certs", "generate", "--out", str(tmp_path / "o"), f"--dns={name}"],
                           capsys)
    assert code == 2
    assert f"--dns {name!r} is not a DNS name" in one_line(err)
    assert not (tmp_path / "o").exists()


def test_generate_accepts_a_leading_wildcard_label(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["certs", "generate", "--out", str(tmp_path), "--dns", "*.webhook.svc",
                    "--dns", "a-b.example"], capsys)[0] == 0
    cert = read_dir(tmp_path).serving.certificate  # type: ignore[union-attr]
    assert sans(cert)[0] == ["*.webhook.svc", "a-b.example"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--ip", "300.1.1.1"], "--ip '300.1.1.1'"),
    (["--service", "Bad_Svc", "--namespace", "ns"], "--service 'Bad_Svc'"),
    (["--dns", "a", "--validity-days", "-1"], "--validity-days"),
    (["--dns", "a", "--ca-validity-days", "nan"], "--ca-validity-days"),
    (["--dns", "a", "--key-type", "dsa"], "--key-type"),
])
def test_generate_other_unusable_values(argv: list[str], message: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["certs", "generate", "--out", str(tmp_path), *argv], capsys)
    assert code == 2
    assert message in one_line(err)


def test_rotate_a_missing_directory_says_so(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    code, _, err = run_cli(["certs", "rotate", "--dir", str(missing)], capsys)
    assert code == 2
    line = one_line(err)
    assert f"--dir {missing} does not exist" in line and "DNS name" not in line
    assert not missing.exists()


def test_rotate_a_directory_without_a_certificate_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["certs", "rotate", "--dir", str(tmp_path)], capsys)
    assert code == 2
    line = one_line(err)
    assert "holds no certificate (tls.crt)" in line and "DNS name" not in line
    # with names it still bootstraps the directory, as before
    assert run_cli(["certs", "rotate", "--dir", str(tmp_path), "--dns", "a"], capsys)[0] == 0
    assert (tmp_path / "tls.crt").exists()


def test_rotate_refuses_negative_durations(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["certs", "rotate", "--dir", str(tmp_path), "--overlap-minutes",
                            "-5"], capsys)
    assert code == 2
    assert "--overlap-minutes" in one_line(err)


def test_help_names_the_files_and_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["certs", "generate", "--help"], capsys)
    gen = " ".join(out.split())
    assert code == 0
    assert "tls.crt, tls.key, ca.crt, ca.key" in gen
    assert "(default: ecdsa)" in gen and "(default: 365.0)" in gen and "(default: 90.0)" in gen
    code, out, _ = run_cli(["certs", "rotate", "--help"], capsys)
    rot = " ".join(out.split())
    assert code == 0
    assert "(default: 30.0)" in rot and "(default: 10.0)" in rot
    assert "start a CA rotation now" in rot and "tls.crt" in rot
