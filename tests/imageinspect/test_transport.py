"""The address guard: link-local and cloud metadata addresses are refused."""

from __future__ import annotations

import pytest

from imageinspect._transport import is_forbidden_address


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
