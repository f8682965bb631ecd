"""``make clients-latest``'s comparison: what a new release sends differently, and whether it is
still served."""

from __future__ import annotations

from typing import Any

import pytest

from clients.report import compare


def _run(version: str, **fields: Any) -> dict[str, Any]:
    return {
        "version": version,
        "exit_code": 0,
        "requests": ["POST /v1/responses 200"],
        "refused": [],
        "ignored_fields": [],
        "body_shape": ["model", "input[].type=message"],
        "headers": ["session-id"],
        **fields,
    }


PINNED = {"codex": _run("0.169.0")}


@pytest.mark.parametrize(
    ("latest", "lines", "ok"),
    [
        pytest.param({"codex": _run("0.169.0")}, ["codex: 0.169.0 -> 0.169.0"], True, id="same"),
        pytest.param(
            {
                "codex": _run(
                    "0.171.0",
                    body_shape=["model", "input[].type=message", "input[].type=hologram"],
                    headers=[],
                    ignored_fields=["reasoning.context"],
                )
            },
            [
                "codex: 0.169.0 -> 0.171.0",
                "  body field new: input[].type=hologram",
                "  header gone: session-id",
                "  ignored field new: reasoning.context",
            ],
            True,
            id="new-fields-still-served",
        ),
        pytest.param(
            {
                "codex": _run(
                    "0.171.0",
                    exit_code=1,
                    requests=["POST /v1/responses 400"],
                    refused=[["/v1/responses", 400, "tools[0].type"]],
                )
            },
            [
                "codex: 0.169.0 -> 0.171.0",
                "  REFUSED /v1/responses 400: tools[0].type",
                "  exit code 1; requests: ['POST /v1/responses 400']",
            ],
            False,
            id="refused",
        ),
        pytest.param({}, ["codex: no run with the latest release"], False, id="did-not-run"),
    ],
)
def test_compare_names_every_difference(latest: dict[str, Any], lines: list[str], ok: bool) -> None:
    assert compare(PINNED, latest) == (lines, ok)
