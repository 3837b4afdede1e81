"""Certificate rotation before expiry, with a CA overlap window so no admission call fails.

The API server verifies the webhook's serving certificate against the MutatingWebhookConfiguration's
``caBundle``. Replacing CA and serving certificate at once would break every call made between
the two updates, so a CA rotation takes two steps:

1. **New CA.** When the signing CA has less than ``rotate_before + overlap`` left (or on
   ``force``), a new CA is generated and *appended* to the trust bundle; it becomes the signing
   CA, but the serving certificate (signed by the old CA) is kept. The controller pushes the
   two-CA bundle into the caBundle.
2. **New serving certificate.** Once ``overlap`` has passed since the new CA's notBefore (which
   is one minute before its creation), the serving certificate is reissued by the new CA. The
   webhook reloads it from disk; the API server trusts it already.

A serving certificate is also reissued by the signing CA when it has less than
``rotate_before`` left, when it is missing or when no trusted CA issued it. A CA is dropped
from the bundle once expired. :func:`plan_rotation` is pure (state and clock in, plan out);
:func:`apply_rotation` generates keys; :func:`rotate_dir` does both on a directory.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from podplacement.certs._generate import KeyPair, generate_ca, issue_serving_cert
from podplacement.certs.store import CertState, read_dir, write_dir

DEFAULT_ROTATE_BEFORE = dt.timedelta(days=30)
DEFAULT_OVERLAP = dt.timedelta(minutes=10)
DEFAULT_CA_VALIDITY = dt.timedelta(days=365)
DEFAULT_VALIDITY = dt.timedelta(days=90)


@dataclass(frozen=True, slots=True)
class RotationPlan:
    """What a rotation run must do.

    Attributes:
        new_ca: generate a CA, append it to the bundle and make it the signing CA.
        reissue_serving: issue a new serving certificate from the signing CA (the new one
            when ``new_ca`` is also set).
        drop_cas: PEM certificates of expired CAs to remove from the bundle.
        reasons: human-readable reasons, one per action.
        next_check: the earliest time at which the plan could change (None: nothing known).
    """

    new_ca: bool
    reissue_serving: bool
    drop_cas: tuple[bytes, ...]
    reasons: tuple[str, ...]
    next_check: dt.datetime | None

    @property
    def noop(self) -> bool:
        """True when nothing needs to change."""
        return not (self.new_ca or self.reissue_serving or self.drop_cas)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:  # InvalidSignature, ValueError (other issuer), TypeError (key type)
        return False
    return True


def plan_rotation(
    state: CertState,
    now: dt.datetime,
    *,
    rotate_before: dt.timedelta = DEFAULT_ROTATE_BEFORE,
    overlap: dt.timedelta = DEFAULT_OVERLAP,
    force: bool = False,
) -> RotationPlan:
    """Decide what to rotate (pure; see the module docstring for the two-step CA rotation).

    Args:
        state: the current material (:func:`certs.store.read_dir` / ``from_secret``).
        now: the current time (timezone-aware).
        rotate_before: renew a serving certificate this long before it expires; a CA is
            renewed ``rotate_before + overlap`` before it expires.
        overlap: how long a new CA is in the bundle before it signs the serving certificate.
        force: start a CA rotation now, whatever the expiry dates.

    Returns:
        A :class:`RotationPlan`.
    """
    reasons: list[str] = []
    checks: list[dt.datetime] = []
    cas = [(pem, x509.load_pem_x509_certificate(pem)) for pem in state.trusted_cas]
    signer = state.signing_ca()
    signer_cert = signer.certificate if signer else None

    drop = tuple(pem for pem, c in cas
                 if c.not_valid_after_utc <= now and (signer is None or pem != signer.cert_pem))
    if drop:
        reasons.append(f"drop {len(drop)} expired CA(s) from the bundle")
    for pem, c in cas:
        if pem not in drop and (signer is None or pem != signer.cert_pem):
            checks.append(c.not_valid_after_utc)

    if signer_cert is None:
        new_ca = True
        reasons.append("no signing CA (missing ca.key or its certificate)")
    elif force:
        new_ca = True
        reasons.append("forced CA rotation")
    elif now >= signer_cert.not_valid_after_utc - (rotate_before + overlap):
        new_ca = True
        reasons.append(f"CA expires at {signer_cert.not_valid_after_utc.isoformat()}")
    else:
        new_ca = False
        checks.append(signer_cert.not_valid_after_utc - (rotate_before + overlap))

    serving = state.serving.certificate if state.serving else None
    trusted = [c for pem, c in cas if pem not in drop]
    issuer = next((c for c in trusted if serving and _issued_by(serving, c)), None)
    if serving is None:
        reissue, why = True, "no serving certificate"
    elif issuer is None:
        reissue, why = True, "serving certificate not issued by a trusted CA"
    elif now >= serving.not_valid_after_utc:
        reissue, why = True, "serving certificate expired"
    elif new_ca:
        # Step 1 of a CA rotation: the new CA must reach the caBundle first.
        reissue, why = False, ""
        checks.append(now + overlap)
    elif signer_cert is not None and issuer != signer_cert:
        overlap_end = signer_cert.not_valid_before_utc + overlap
        reissue = now >= overlap_end or now >= serving.not_valid_after_utc - rotate_before
        why = "CA overlap window over: reissue from the new CA"
        if not reissue:
            checks.append(overlap_end)
    elif now >= serving.not_valid_after_utc - rotate_before:
        reissue, why = True, f"serving certificate expires at {serving.not_valid_after_utc}"
    else:
        reissue, why = False, ""
        checks.append(serving.not_valid_after_utc - rotate_before)
    if reissue:
        reasons.append(why)
    return RotationPlan(new_ca, reissue, drop, tuple(reasons), min(checks) if checks else None)


def _sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (list(ext.get_values_for_type(x509.DNSName)),
            [str(a) for a in ext.get_values_for_type(x509.IPAddress)])


def apply_rotation(
    state: CertState,
    plan: RotationPlan,
    *,
    dns_names: Sequence[str] | None = None,
    ip_addresses: Sequence[str] | None = None,
    key_type: str = "ecdsa",
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY,
    validity: dt.timedelta = DEFAULT_VALIDITY,
    now: dt.datetime | None = None,
) -> CertState:
    """Carry out ``plan`` and return the new state (generates keys; no file I/O).

    Args:
        dns_names / ip_addresses: SANs of a reissued serving certificate; default: those of
            the current serving certificate.
        key_type: ``ecdsa`` (P-256) or ``rsa`` (2048) for new keys.
        ca_validity / validity: lifetimes of a new CA / serving certificate; a serving
            certificate never outlives its CA.
        now: issue time (default: the wall clock). New certificates start one minute earlier
            to tolerate clock skew.

    Raises:
        ValueError: a serving certificate must be issued but no SAN is known.
    """
    issued_at = now or dt.datetime.now(dt.UTC)
    start = issued_at - dt.timedelta(minutes=1)
    trusted = [pem for pem in state.trusted_cas if pem not in plan.drop_cas]
    ca_key = state.ca_key_pem
    signer: KeyPair | None = state.signing_ca()
    if plan.new_ca:
        signer = generate_ca(validity=ca_validity, key_type=key_type, not_before=start)
        trusted.append(signer.cert_pem)
        ca_key = signer.key_pem
    serving = state.serving
    if plan.reissue_serving:
        if signer is None:
            raise ValueError("no signing CA to issue the serving certificate")
        old_dns, old_ips = _sans(serving.certificate) if serving else ([], [])
        names = list(dns_names) if dns_names is not None else old_dns
        ips = list(ip_addresses) if ip_addresses is not None else old_ips
        lifetime = min(validity, signer.certificate.not_valid_after_utc - start)
        serving = issue_serving_cert(signer, names, ips, validity=lifetime, key_type=key_type,
                                     not_before=start)
    return CertState(serving, ca_key, tuple(trusted))


def rotate_dir(
    directory: str | Path,
    *,
    now: dt.datetime | None = None,
    rotate_before: dt.timedelta = DEFAULT_ROTATE_BEFORE,
    overlap: dt.timedelta = DEFAULT_OVERLAP,
    force: bool = False,
    dns_names: Sequence[str] | None = None,
    ip_addresses: Sequence[str] | None = None,
    key_type: str = "ecdsa",
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY,
    validity: dt.timedelta = DEFAULT_VALIDITY,
) -> RotationPlan:
    """Plan and apply a rotation on a certificate directory; writes only when needed.

    Returns the plan that was applied. Raises:
        certs.store.CertStoreError: the directory holds unparseable material.
        ValueError: see :func:`apply_rotation`.
        OSError: the directory cannot be written.
    """
    clock = now or dt.datetime.now(dt.UTC)
    state = read_dir(directory)
    plan = plan_rotation(state, clock, rotate_before=rotate_before, overlap=overlap, force=force)
    if dns_names is not None or ip_addresses is not None:
        signer = state.signing_ca()
        # Inside a CA overlap window the serving certificate is still from the old CA: a
        # reissue now would be signed by a CA the API server may not trust yet, so a SAN
        # change waits for step 2 (which reissues with the new SANs anyway).
        if (state.serving is not None and not plan.reissue_serving and not plan.new_ca
                and signer is not None
                and _issued_by(state.serving.certificate, signer.certificate)):
            old = _sans(state.serving.certificate)
            want = (list(dns_names or []), list(ip_addresses or []))
            if (sorted(old[0]), sorted(old[1])) != (sorted(want[0]), sorted(want[1])):
                plan = RotationPlan(plan.new_ca, True, plan.drop_cas,
                                    (*plan.reasons, "SANs changed"), plan.next_check)
    if not plan.noop:
        new_state = apply_rotation(state, plan, dns_names=dns_names, ip_addresses=ip_addresses,
                                   key_type=key_type, ca_validity=ca_validity,
                                   validity=validity)
        write_dir(directory, new_state)
    return plan
