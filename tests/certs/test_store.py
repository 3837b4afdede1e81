"""certs.store: directory and kubernetes.io/tls Secret storage, caBundle."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography import x509

from podplacement.certs import (
    CertState,
    CertStoreError,
    ca_bundle,
    from_secret,
    generate_ca,
    issue_serving_cert,
    load_bundle,
    read_dir,
    to_secret,
    write_dir,
)


@pytest.fixture(scope="module")
def state() -> CertState:
    old, new = generate_ca("old-ca"), generate_ca("new-ca")
    serving = issue_serving_cert(new, ["svc", "svc.ns.svc"], ["127.0.0.1"])
    return CertState(serving, new.key_pem, (old.cert_pem, new.cert_pem))


def test_directory_round_trip(tmp_path: Path, state: CertState) -> None:
    write_dir(tmp_path / "d", state)
    assert read_dir(tmp_path / "d") == state
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "ca.crt", "ca.key", "tls.crt", "tls.key"]  # no temp files left behind
    assert stat.S_IMODE((tmp_path / "d" / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "d" / "ca.key").stat().st_mode) == 0o600


def test_unchanged_files_keep_their_inode(tmp_path: Path, state: CertState) -> None:
    write_dir(tmp_path, state)
    before = (tmp_path / "tls.crt").stat().st_ino
    write_dir(tmp_path, state)
    assert (tmp_path / "tls.crt").stat().st_ino == before


def test_bundle_holds_every_trusted_ca_in_order(tmp_path: Path, state: CertState) -> None:
    write_dir(tmp_path, state)
    bundle = load_bundle(tmp_path)
    assert bundle == ca_bundle(state) == state.trusted_cas[0] + state.trusted_cas[1]
    names = [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(bundle)]
    assert names == ["CN=old-ca", "CN=new-ca"]


def test_signing_ca_is_the_one_matching_ca_key(state: CertState) -> None:
    signer = state.signing_ca()
    assert signer is not None
    assert signer.certificate.subject.rfc4514_string() == "CN=new-ca"


def test_load_bundle_without_ca_file_raises(tmp_path: Path) -> None:
    with pytest.raises(CertStoreError, match=r"ca\.crt"):
        load_bundle(tmp_path)


def test_load_bundle_with_garbage_raises(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"
    (tmp_path / "ca.crt").write_bytes(pem)
    with pytest.raises(CertStoreError):
        load_bundle(tmp_path)


def test_half_a_serving_pair_is_an_error(tmp_path: Path, state: CertState) -> None:
    write_dir(tmp_path, state)
    (tmp_path / "tls.key").unlink()
    with pytest.raises(CertStoreError, match="both"):
        read_dir(tmp_path)


def test_empty_directory_reads_as_empty_state(tmp_path: Path) -> None:
    assert read_dir(tmp_path) == CertState(None, None, ())


def test_secret_round_trip(state: CertState) -> None:
    secret = to_secret(state, "podplacement-webhook-certs", "podplacement-system")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"] == {"name": "podplacement-webhook-certs",
                                  "namespace": "podplacement-system"}
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert base64.b64decode(secret["data"]["ca.crt"]) == state.bundle()
    assert from_secret(secret) == state


def test_secret_without_ca_key(state: CertState) -> None:
    secret = to_secret(state, "s", "ns", include_ca_key=False)
    assert "ca.key" not in secret["data"]
    assert from_secret(secret).ca_key_pem is None


def test_secret_with_bad_base64_raises(state: CertState) -> None:
    secret = to_secret(state, "s", "ns")
    secret["data"]["tls.crt"] = "%%%"
    with pytest.raises(CertStoreError, match="base64"):
        from_secret(secret)


def test_tls_secret_needs_a_serving_pair(state: CertState) -> None:
    with pytest.raises(ValueError, match=r"tls\.crt"):
        to_secret(CertState(None, state.ca_key_pem, state.trusted_cas), "s", "ns")
