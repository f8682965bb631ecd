"""The ``kvretention`` command line: development tools appear only where devtools/ is installed."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner

from kvretention import cli


def test_the_cluster_tool_is_listed_in_a_source_checkout() -> None:
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0 and "cluster" in result.output


def test_without_devtools_the_cluster_tool_is_hidden_and_explains_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "kvretention_devtools" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    listed = CliRunner().invoke(cli.main, ["--help"])
    assert listed.exit_code == 0 and "cluster" not in listed.output
    assert "operator" in listed.output
    used = CliRunner().invoke(cli.main, ["cluster", "up"])
    assert used.exit_code == 2
    assert "make bootstrap" in used.output and "Traceback" not in used.output
