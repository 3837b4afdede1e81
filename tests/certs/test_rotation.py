"""certs.rotation: the two-step CA rotation with an overlap window, serving renewal, CA drop."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509

from podplacement.certs import (
    CertState,
    apply_rotation,
    generate_ca,
    issue_serving_cert,
    plan_rotation,
    read_dir,
    rotate_dir,
    write_dir,
)

DAY = dt.timedelta(days=1)
BEFORE = 30 * DAY
OVERLAP = dt.timedelta(hours=1)


def fresh_state(ca_days: int = 365, serving_days: int = 90) -> CertState:
    ca = generate_ca(validity=ca_days * DAY)
    serving = issue_serving_cert(ca, ["svc.ns.svc"], ["10.0.0.1"], validity=serving_days * DAY)
    return CertState(serving, ca.key_pem, (ca.cert_pem,))


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def plan(state: CertState, at: dt.datetime, force: bool = False):  # type: ignore[no-untyped-def]
    return plan_rotation(state, at, rotate_before=BEFORE, overlap=OVERLAP, force=force)


def test_fresh_certificates_need_nothing() -> None:
    state = fresh_state()
    p = plan(state, now())
    assert p.noop
    serving = state.serving.certificate  # type: ignore[union-attr]
    assert p.next_check == serving.not_valid_after_utc - BEFORE


def test_serving_certificate_is_renewed_before_expiry_by_the_same_ca() -> None:
    state = fresh_state()
    serving = state.serving.certificate  # type: ignore[union-attr]
    p = plan(state, serving.not_valid_after_utc - BEFORE + dt.timedelta(seconds=1))
    assert p.reissue_serving and not p.new_ca
    new = apply_rotation(state, p)
    assert new.trusted_cas == state.trusted_cas
    ca = x509.load_pem_x509_certificate(state.trusted_cas[0])
    new.serving.certificate.verify_directly_issued_by(ca)  # type: ignore[union-attr]
    sans = new.serving.certificate.extensions.get_extension_for_class(  # type: ignore[union-attr]
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["svc.ns.svc"]


def test_ca_rotation_takes_two_steps_with_both_cas_trusted() -> None:
    state = fresh_state(ca_days=60, serving_days=50)
    old_ca = x509.load_pem_x509_certificate(state.trusted_cas[0])
    # Step 1: CA within rotate_before + overlap of expiry: new CA, serving unchanged.
    p1 = plan(state, now() + 60 * DAY - BEFORE - OVERLAP + dt.timedelta(minutes=1))
    assert p1.new_ca and not p1.reissue_serving
    s1 = apply_rotation(state, p1)
    assert s1.serving == state.serving
    assert s1.trusted_cas[0] == state.trusted_cas[0] and len(s1.trusted_cas) == 2
    new_ca = x509.load_pem_x509_certificate(s1.trusted_cas[1])
    assert s1.signing_ca().certificate == new_ca  # type: ignore[union-attr]
    # Within the overlap window nothing more happens.
    issued = new_ca.not_valid_before_utc
    p_wait = plan(s1, issued + OVERLAP - dt.timedelta(seconds=1))
    assert p_wait.noop and p_wait.next_check == issued + OVERLAP
    # Step 2: after the overlap, the serving certificate comes from the new CA.
    p2 = plan(s1, issued + OVERLAP)
    assert p2.reissue_serving and not p2.new_ca and not p2.drop_cas
    s2 = apply_rotation(s1, p2)
    s2.serving.certificate.verify_directly_issued_by(new_ca)  # type: ignore[union-attr]
    assert len(s2.trusted_cas) == 2
    # Step 3: the old CA leaves the bundle once expired.
    p3 = plan(s2, old_ca.not_valid_after_utc)
    assert p3.drop_cas == (state.trusted_cas[0],) and not p3.new_ca
    assert apply_rotation(s2, p3).trusted_cas == (s1.trusted_cas[1],)


def test_forced_rotation_starts_with_a_new_ca_only() -> None:
    state = fresh_state()
    p = plan(state, now(), force=True)
    assert p.new_ca and not p.reissue_serving
    assert p.next_check is not None


def test_missing_ca_key_gives_new_ca_and_immediate_serving() -> None:
    state = fresh_state()
    p = plan(CertState(state.serving, None, state.trusted_cas), now())
    assert p.new_ca
    assert not p.reissue_serving  # the existing serving cert is trusted: keep it for the overlap
    empty = plan(CertState(None, None, ()), now())
    assert empty.new_ca and empty.reissue_serving


def test_untrusted_serving_certificate_is_replaced_at_once() -> None:
    state = fresh_state()
    stranger = issue_serving_cert(generate_ca(), ["x"])
    p = plan(CertState(stranger, state.ca_key_pem, state.trusted_cas), now())
    assert p.reissue_serving and not p.new_ca


def test_serving_certificate_never_outlives_its_ca() -> None:
    state = fresh_state(ca_days=45, serving_days=10)
    p = plan(state, now())
    assert p.reissue_serving and not p.new_ca
    renewed = apply_rotation(state, p, validity=400 * DAY)
    ca = renewed.signing_ca()
    assert renewed.serving is not None and ca is not None
    assert renewed.serving.certificate.not_valid_after_utc <= ca.certificate.not_valid_after_utc


def test_rotate_dir_writes_only_when_needed(tmp_path: Path) -> None:
    write_dir(tmp_path, fresh_state())
    before = read_dir(tmp_path)
    assert rotate_dir(tmp_path).noop
    assert read_dir(tmp_path) == before
    p = rotate_dir(tmp_path, force=True)
    assert p.new_ca
    assert len(read_dir(tmp_path).trusted_cas) == 2


def test_rotate_dir_reissues_when_sans_change(tmp_path: Path) -> None:
    write_dir(tmp_path, fresh_state())
    p = rotate_dir(tmp_path, dns_names=["other.ns.svc"])
    assert p.reissue_serving
    cert = read_dir(tmp_path).serving.certificate  # type: ignore[union-attr]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["other.ns.svc"]


def test_san_change_waits_for_the_overlap_window_to_end(tmp_path: Path) -> None:
    write_dir(tmp_path, fresh_state())
    old_serving = read_dir(tmp_path).serving
    assert rotate_dir(tmp_path, force=True, overlap=OVERLAP).new_ca  # step 1: new CA in bundle
    # Inside the overlap a SAN change must not reissue from the not-yet-trusted new CA.
    p = rotate_dir(tmp_path, dns_names=["other.ns.svc"], overlap=OVERLAP)
    assert not p.reissue_serving
    assert read_dir(tmp_path).serving == old_serving
    # After the overlap, step 2 reissues from the new CA, with the new SANs.
    p = rotate_dir(tmp_path, dns_names=["other.ns.svc"], overlap=OVERLAP, now=now() + 2 * OVERLAP)
    assert p.reissue_serving
    state = read_dir(tmp_path)
    cert = state.serving.certificate  # type: ignore[union-attr]
    signer = state.signing_ca()
    assert signer is not None
    cert.verify_directly_issued_by(signer.certificate)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["other.ns.svc"]


def test_reissue_without_any_name_is_an_error() -> None:
    p = plan(CertState(None, None, ()), now())
    with pytest.raises(ValueError):
        apply_rotation(CertState(None, None, ()), p)


def test_rotate_dir_on_an_empty_directory_creates_everything(tmp_path: Path) -> None:
    p = rotate_dir(tmp_path / "new", dns_names=["svc.ns.svc"])
    assert p.new_ca and p.reissue_serving
    state = read_dir(tmp_path / "new")
    ca = state.signing_ca()
    assert ca is not None and state.serving is not None
    state.serving.certificate.verify_directly_issued_by(ca.certificate)
    assert rotate_dir(tmp_path / "new").noop
