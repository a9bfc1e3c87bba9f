"""Kubernetes quantities of bytes ("8Gi", "1.5G", "512e6"): read, added up and written
back, for the sizes the KV tiers add to a container's memory and ephemeral storage."""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

# A Kubernetes quantity (100Gi, 1.5T), the CRD's pattern.
QUANTITY = (
    r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)
# The same without a sign: a size.
SIZE = QUANTITY.removeprefix(r"(\+|-)?")
GIB = 2**30
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_bytes(quantity: str | int) -> int:
    """The bytes `quantity` stands for, rounded up to a whole byte (as Kubernetes rounds
    memory). Raises ValueError for anything that is not a quantity."""
    text = str(quantity)
    if not re.fullmatch(QUANTITY, text):
        raise ValueError(f"not a quantity: {quantity!r}")
    number, suffix = re.fullmatch(r"([+-]?[0-9.]+)(.*)", text).groups()
    with localcontext() as context:
        context.prec = 60  # exact for any quantity a pod could ask for
        if suffix in _BINARY:
            value = Decimal(number) * _BINARY[suffix]
        elif suffix in _DECIMAL:
            value = Decimal(number).scaleb(_DECIMAL[suffix])
        else:  # an exponent: e3, E-2
            value = Decimal(number).scaleb(int(suffix[1:]))
        return math.ceil(value)


def format_bytes(num_bytes: int) -> str:
    """`num_bytes` as a quantity in the largest binary unit that holds it exactly (72Gi,
    1536Mi), or as a plain number of bytes."""
    for suffix, unit in reversed(_BINARY.items()):
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def format_gib(num_bytes: int) -> str:
    """`num_bytes` in GiB as an exact decimal, for a `--*-gib` flag: 8Gi -> "8", 512Mi ->
    "0.5", 10G -> "9.31322574615478515625"."""
    with localcontext() as context:
        context.prec = 60
        return format((Decimal(num_bytes) / GIB).normalize(), "f")
