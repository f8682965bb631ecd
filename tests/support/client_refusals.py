"""The request parsers' refusals as the unit tests check them: each names its field and its code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kvretention.hints.errors import ClientError

Refusal = tuple[dict[str, Any], str, str]
"""(request fields, the refused field's ``param``, the error code)"""


def refusal_cases(rows: Sequence[Refusal]) -> list[Any]:
    """The rows as pytest params, each named ``param:code``."""
    return [pytest.param(*row, id=f"{row[1]}:{row[2]}") for row in rows]


def refused(parse: Callable[[], object]) -> ClientError:
    """The ClientError ``parse()`` raises; the test fails where it raises none."""
    with pytest.raises(ClientError) as info:
        parse()
    return info.value


def assert_refused(parse: Callable[[], object], *, param: str, code: str) -> None:
    """``parse()`` is a 400 naming ``param`` with ``code``."""
    err = refused(parse)
    assert (err.param, err.code.value, err.status) == (param, code, 400)
