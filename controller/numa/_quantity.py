"""Kubernetes resource quantities as integers, and the resource-name classes the NUMA rules use.

Quantities (``"500m"``, ``"2Gi"``, ``"1e3"``, JSON ints) become integers: cpu in millicores,
every other resource in base units. Like ``resource.Quantity.MilliValue()`` / ``Value()`` in
apimachinery, a fractional result is rounded **up**. Scores use :func:`score_value`, which is
``Quantity.Value()`` (cpu in whole cores, rounded up), as the scheduler-plugins score code does.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
EPHEMERAL_STORAGE = "ephemeral-storage"
STORAGE = "storage"
HUGEPAGES_PREFIX = "hugepages-"

#: Resources a node's allocatable always has (the scheduler's NodeInfo.Allocatable keeps them
#: even at zero), so they never fail the "missing from the node's allocatable" check.
ALWAYS_ALLOCATABLE = frozenset({CPU, MEMORY, PODS, EPHEMERAL_STORAGE})

_MULTIPLIERS: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
# The exponent form is tried before the bare "E" (exa) suffix, as the apimachinery parser does.
_QUANTITY_RE = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                 ("Ki", 2**10))


class QuantityError(ValueError):
    """A resource quantity does not follow the Kubernetes quantity grammar.

    Attributes:
        text: the offending value as given.
    """

    def __init__(self, text: object) -> None:
        super().__init__(f"invalid resource quantity {text!r}")
        self.text = text


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    match = _QUANTITY_RE.match(text.strip())
    if not match:
        raise QuantityError(text)
    sign, number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent is not None:
        value *= Fraction(10) ** int(exponent)
    else:
        value *= _MULTIPLIERS[suffix or ""]
    return -value if sign == "-" else value


def parse_quantity(resource: str, value: object) -> int:
    """Parse a quantity into an integer: millicores for ``cpu``, base units otherwise.

    Args:
        resource: the resource name (decides the unit).
        value: a quantity string (``"500m"``, ``"2Gi"``, ``"1e3"``) or a JSON number.
    Returns:
        the amount, rounded up like ``Quantity.MilliValue()`` (cpu) / ``Quantity.Value()``.
    Raises:
        QuantityError: the value is not a Kubernetes quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(value)
    if isinstance(value, int):
        return value * 1000 if resource == CPU else value
    if isinstance(value, str):
        return _parse_str(resource == CPU, value)
    if isinstance(value, float):
        exact = Fraction(str(value))
    else:
        raise QuantityError(value)
    return _ceil(exact * 1000) if resource == CPU else _ceil(exact)


@lru_cache(maxsize=4096)
def _parse_str(cpu: bool, text: str) -> int:
    # Pods of one workload repeat the same few strings: skip the Fraction arithmetic.
    exact = _parse_text(text)
    return _ceil(exact * 1000) if cpu else _ceil(exact)


def score_value(resource: str, amount: int) -> int:
    """``Quantity.Value()`` of an amount from :func:`parse_quantity` (cpu: whole cores, up)."""
    if resource == CPU:
        return -((-amount) // 1000)
    return amount


def format_quantity(resource: str, amount: int) -> str:
    """Render an amount for humans: cpu ``"9"``/``"500m"``, memory-like ``"40Gi"``, else int."""
    if resource == CPU:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if amount > 0 and (resource in (MEMORY, EPHEMERAL_STORAGE, STORAGE)
                       or resource.startswith(HUGEPAGES_PREFIX)):
        for suffix, unit in _BINARY_UNITS:
            if amount % unit == 0:
                return f"{amount // unit}{suffix}"
    return str(amount)


def is_hugepages(resource: str) -> bool:
    """True for ``hugepages-<size>`` (v1helper.IsHugePageResourceName)."""
    return resource.startswith(HUGEPAGES_PREFIX)


def is_native(resource: str) -> bool:
    """True for names without a domain or in ``kubernetes.io/`` (v1helper.IsNativeResource)."""
    return "/" not in resource or resource.startswith("kubernetes.io/")


def is_numa_affine(resource: str) -> bool:
    """cpu, memory and hugepages must expose NUMA affinity (scheduler-plugins numaresources)."""
    return resource == CPU or resource == MEMORY or resource.startswith(HUGEPAGES_PREFIX)


def is_host_level(resource: str) -> bool:
    """Resources that may lack NUMA affinity: ephemeral-storage, storage, extended resources."""
    return resource == EPHEMERAL_STORAGE or resource == STORAGE or not is_native(resource)
