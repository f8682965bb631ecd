"""Every SGLang flag the builders render exists in the installed sglang 0.5.23 source.

SGLang's server arguments are msgspec fields in ``sglang/srt/arg_groups/fields/*.py``; a field
``x_y`` is the flag ``--x-y``, plus any ``aliases=[...]``. Reading the source (not importing it)
works without torch.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import get_args

import pytest

from kvretention.api.models import KvRetentionDeployment, ReasoningParserName, ToolCallParser
from kvretention.controller.resources import build_sglang_args
from kvretention.controller.resources.sglang_args import MANAGED_FLAGS

pytestmark = pytest.mark.engine

FIELD = re.compile(r"^    ([a-z][a-z0-9_]*): (?:A\[|Optional\[)", re.MULTILINE)
ALIASES = re.compile(r"aliases=\[([^\]]*)\]")


def sglang_flags() -> set[str]:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang 0.5.23 is not installed"
    fields = Path(next(iter(spec.submodule_search_locations))) / "srt" / "arg_groups" / "fields"
    flags: set[str] = set()
    for source in fields.glob("*.py"):
        text = source.read_text()
        flags |= {"--" + name.replace("_", "-") for name in FIELD.findall(text)}
        for group in ALIASES.findall(text):
            flags |= set(re.findall(r"\"(--[a-z0-9-]+)\"", group))
    return flags


def test_flag_table_is_found() -> None:
    assert {"--model-path", "--tp-size", "--enable-hierarchical-cache"} <= sglang_flags()


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_rendered_flags_exist(mode: str) -> None:
    workers: dict[str, object] = {"mode": mode, "hicache": {"sizeGiB": 4}}
    if mode == "disaggregated":
        workers |= {"prefill": {}, "decode": {}}
    cr = KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "s"},
            "spec": {
                "model": {
                    "name": "m",
                    "path": "p",
                    "toolCallParser": "qwen3_coder",
                    "reasoningParser": "deepseek-r1",
                },
                "workers": workers,
                "kvStore": {"mooncake": {"transfer": {"protocol": "rdma", "device": "mlx5_0"}}},
            },
        }
    )
    roles = ["aggregated"] if mode == "aggregated" else ["prefill", "decode"]
    rendered = {
        a for role in roles for a in build_sglang_args(cr.spec, role=role) if a.startswith("--")
    }
    assert rendered - sglang_flags() == set()


def test_managed_flags_exist() -> None:
    assert MANAGED_FLAGS - sglang_flags() == set()


def _registry_keys(relative: str, anchor: str) -> list[str]:
    """The string keys of a class-level dict literal in SGLang's source (no torch needed)."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang 0.5.23 is not installed"
    text = (Path(next(iter(spec.submodule_search_locations))) / relative).read_text()
    start = text.index(anchor)
    return re.findall(r"^\s+\"([^\"]+)\":", text[start : text.index("}", start)], re.MULTILINE)


@pytest.mark.parametrize(
    ("literal", "relative", "anchor"),
    [
        (ToolCallParser, "srt/function_call/function_call_parser.py", "ToolCallParserEnum"),
        (ReasoningParserName, "srt/parser/reasoning_parser.py", "DetectorMap"),
    ],
    ids=["tool_call_parser", "reasoning_parser"],
)
def test_parser_names_are_sglangs(literal: object, relative: str, anchor: str) -> None:
    """The CRD's parser enums are exactly the names the installed SGLang accepts."""
    keys = _registry_keys(relative, anchor)
    assert len(keys) > 10, f"{anchor} not found in {relative}"
    assert list(get_args(literal)) == keys
