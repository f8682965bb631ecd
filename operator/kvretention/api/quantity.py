"""Kubernetes resource quantities: parsing (``16Gi`` -> 17179869184) and the bounds a request or
limit must stay within, written once as a table that yields both the CEL rule the API server runs
at admission and the Python check ``render`` runs."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

_QUANTITY: Final = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
)
_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    # Decimal k = 10^3 ... E = 10^18; binary Ki = 2^10 ... Ei = 2^60.
    **{prefix: Decimal(10 ** (3 * n)) for n, prefix in enumerate("kMGTPE", start=1)},
    **{f"{prefix}i": Decimal(2 ** (10 * n)) for n, prefix in enumerate("KMGTPE", start=1)},
}
GIB: Final = Decimal(2**30)

QUANTITY_MAX_LENGTH: Final = 64
"""Longest quantity string (``16Gi``, ``500m``); keeps the CEL rule's cost estimate bounded."""


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity as a number (``16Gi`` -> 17179869184); ``ValueError`` if malformed.

    The API server's grammar: no spaces, one optional sign, digits with at most one point, then
    a binary (``Ki``) or decimal (``k``) suffix or an exponent (``1e3``)."""
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
        if suffix[:1] in ("e", "E") and len(suffix) > 1:
            return base * Decimal(10) ** int(suffix[1:])
        return base * _SUFFIX[suffix]
    except (ArithmeticError, ValueError):  # "1e999999999", an exponent of 5000 digits
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None


# -- what one node can have ----------------------------------------------------------------------

NODE_BOUNDS: Final[tuple[tuple[str, str], ...]] = (
    ("cpu", "4096"),
    ("memory", "64Ti"),
    ("ephemeral-storage", "1Pi"),
    ("hugepages-*", "64Ti"),
    ("*", "4096"),
)
"""The largest request or limit of each resource, a bound well past any node built today (4,096
cores, 64 TiB of memory, 1 PiB of local storage; GPUs and other devices are counted in units):
``memory: 1e100`` is a typo, not a node. ``name-*`` matches a prefix, ``*`` every other name."""


def node_bound(resource: str) -> str:
    """The bound of ``resource`` from :data:`NODE_BOUNDS` (the first pattern that matches)."""
    for pattern, bound in NODE_BOUNDS:
        if pattern == resource or pattern == "*":
            return bound
        if pattern.endswith("*") and resource.startswith(pattern[:-1]):
            return bound
    raise AssertionError("NODE_BOUNDS ends with '*'")  # pragma: no cover


def _bounds_text() -> str:
    return ", ".join(f"{'any other resource' if p == '*' else p} {b}" for p, b in NODE_BOUNDS)


QUANTITY_MESSAGE: Final = (
    "every value must be a Kubernetes quantity (such as 2, 500m or 16Gi), not negative, and at "
    f"most what one node can have: {_bounds_text()}"
)


def quantity_problem(resource: str, value: int | str) -> str | None:
    """What is wrong with one request or limit, or None (the same judgment as
    :data:`QUANTITY_RULE`)."""
    try:
        parsed = parse_quantity(value)
    except ValueError as exc:
        return f"{resource}: {exc}"
    if parsed < 0:
        return f"{resource}: {value!r} must not be negative"
    bound = node_bound(resource)
    if parsed > parse_quantity(bound):
        return f"{resource}: {value!r} is more than one node can have (at most {bound})"
    return None


def _cel_bound(key: str) -> str:
    """CEL: the bound of resource ``key``, as the chain of :data:`NODE_BOUNDS`."""
    out = ""
    for pattern, bound in NODE_BOUNDS:
        if pattern == "*":
            return out + f"'{bound}'"
        test = (
            f"{key}.startsWith('{pattern[:-1]}')"
            if pattern.endswith("*")
            else f"{key} == '{pattern}'"
        )
        out += f"{test} ? '{bound}' : "
    raise AssertionError("NODE_BOUNDS ends with '*'")  # pragma: no cover


def _cel_ok(key: str) -> str:
    value = f"string(self[{key}])"
    return (
        f"isQuantity({value}) && !quantity({value}).isLessThan(quantity('0')) && "
        f"quantity({value}).compareTo(quantity({_cel_bound(key)})) <= 0"
    )


QUANTITY_RULE: Final = f"self.all(k, {_cel_ok('k')})"
"""CEL on a requests or limits map: every value a quantity within :data:`NODE_BOUNDS`."""
