"""The address guard: link-local and cloud metadata addresses are refused, also when an IPv6
address embeds one (RFC 6052 NAT64, RFC 4291 §2.5.5 compatible/mapped, RFC 3056 6to4, RFC 4380
Teredo, RFC 2765 translated)."""

from __future__ import annotations

import pytest

from podplacement.imageinspect._transport import is_forbidden_address


@pytest.mark.parametrize(
    ("address", "forbidden"),
    [
        ("169.254.169.254", True),
        ("169.254.0.1", True),
        ("fe80::1", True),
        ("fe80::1%eth0", True),
        ("::ffff:169.254.169.254", True),
        ("fd00:ec2::254", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("10.0.0.1", False),
        ("registry.example.com", False),
    ],
)
def test_forbidden_addresses(address: str, forbidden: bool) -> None:
    assert is_forbidden_address(address) is forbidden


@pytest.mark.parametrize(
    ("address", "forbidden"),
    [
        # NAT64 well-known prefix, RFC 6052 §2.1: the IPv4 is the last 32 bits.
        ("64:ff9b::a9fe:a9fe", True),
        ("64:ff9b::169.254.169.254", True),
        ("64:ff9b::a9fe:1", True),
        ("64:ff9b::808:808", False),  # 8.8.8.8
        ("64:ff9b::a00:1", False),  # 10.0.0.1
        # NAT64 local-use prefix 64:ff9b:1::/48 (RFC 8215), every RFC 6052 §2.2 position.
        ("64:ff9b:1::a9fe:a9fe", True),  # /96
        ("64:ff9b:1::169.254.0.1", True),  # /96, dotted
        ("64:ff9b:1:0:a9:fea9:fe00:0", True),  # /64: bits 72-103
        ("64:ff9b:1:a9:fe:a9fe::", True),  # /56: bits 56-63 and 72-95
        ("64:ff9b:1:a9fe:a9:fe00::", True),  # /48: bits 48-63 and 72-87
        ("64:ff9b:1::808:808", False),
        ("64:ff9b:1:808:8:800::", False),  # 8.8.8.8 at the /48 position
        # IPv4-compatible ::a.b.c.d, RFC 4291 §2.5.5.1 (:: and ::1 are not IPv4).
        ("::169.254.169.254", True),
        ("::a9fe:1", True),
        ("::8.8.8.8", False),
        ("::", False),
        ("::1", False),
        # IPv4-mapped ::ffff:a.b.c.d, RFC 4291 §2.5.5.2.
        ("::ffff:a9fe:a9fe", True),
        ("::ffff:10.0.0.1", False),
        # IPv4-translated ::ffff:0:a.b.c.d, RFC 2765 §2.1.
        ("::ffff:0:169.254.169.254", True),
        ("::ffff:0:8.8.8.8", False),
        # 6to4 2002:aabb:ccdd::/48, RFC 3056 §2.
        ("2002:a9fe:a9fe::1", True),
        ("2002:a9fe:1:1::", True),
        ("2002:808:808::1", False),
        # Teredo 2001::/32, RFC 4380 §4: server, and the client stored bit-inverted.
        ("2001:0:a9fe:a9fe::", True),
        ("2001:0:4136:e378:8000:63bf:5601:5601", True),  # client 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # client 192.0.2.45
        # Not embedding anything: ordinary global and ULA addresses.
        ("2001:db8::a9fe:a9fe", False),
        ("fd00::a9fe:a9fe", False),
        ("2606:4700::6810:84e5", False),
        # Not IP literals at all: no address to refuse (host names are checked once resolved).
        ("", False),
        ("64:ff9b::zz", False),
        ("[64:ff9b::a9fe:a9fe]", False),
    ],
)
def test_ipv6_forms_embedding_ipv4(address: str, forbidden: bool) -> None:
    assert is_forbidden_address(address) is forbidden


@pytest.mark.parametrize("ipv4", ["169.254.169.254", "169.254.0.1", "10.0.0.1", "8.8.8.8"])
@pytest.mark.parametrize(
    "form",
    [
        "::ffff:{v4}",
        "64:ff9b::{v4}",
        "64:ff9b:1::{v4}",
        "::{v4}",
        "::ffff:0:{v4}",
        "2002:{hi}:{lo}::1",
    ],
)
def test_embedded_ipv4_follows_the_ipv4_rule(ipv4: str, form: str) -> None:
    octets = [int(o) for o in ipv4.split(".")]
    hi = f"{octets[0] << 8 | octets[1]:x}"
    lo = f"{octets[2] << 8 | octets[3]:x}"
    address = form.format(v4=ipv4, hi=hi, lo=lo)
    assert is_forbidden_address(address) is is_forbidden_address(ipv4)
    assert is_forbidden_address(ipv4) is ipv4.startswith("169.254.")
