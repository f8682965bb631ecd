"""Every SGLang flag the builders render exists in the installed sglang 0.5.23 source, and the
operator's copy of SGLang's argument parser (``sglang_options.json``) is SGLang's.

SGLang's server arguments are msgspec fields in ``sglang/srt/arg_groups/fields/*.py``; a field
``x_y`` is the flag ``--x-y`` (or its ``cli_name=``), plus any ``aliases=[...]``; a few more are
``parser.add_argument("--...")`` calls in ``server_args.py``. Reading the source (not importing it)
works without torch. ``KVR_UPDATE_GOLDEN=1`` regenerates the option table from SGLang's real
parser, which does need torch (importing ``sglang.srt.server_args`` pulls it in).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import get_args

import pytest

from kvretention.api.models import KvRetentionDeployment, ReasoningParserName, ToolCallParser
from kvretention.controller.resources import build_sglang_args, sglang_cli
from kvretention.controller.resources.sglang_args import MANAGED_FLAGS

pytestmark = pytest.mark.engine

FIELD = re.compile(r"^    ([a-z][a-z0-9_]*): (?:A\[|Optional\[)", re.MULTILINE)
ALIASES = re.compile(r"aliases=\[([^\]]*)\]")


def sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang 0.5.23 is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def sglang_flags() -> set[str]:
    fields = sglang_root() / "srt" / "arg_groups" / "fields"
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


OPTIONS_PATH = Path(sglang_cli.__file__).with_name(sglang_cli.OPTIONS_FILE)
CLI_NAME = re.compile(r"cli_name=\"(--[a-z0-9-]+)\"")
MANUAL = re.compile(r"add_argument\(\s*\"(--[a-z0-9-]+)\"")


def real_parser_table() -> dict[str, object]:
    """The option table of SGLang's real parser (imports SGLang: needs torch)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    actions = [
        {"options": list(a.option_strings), "dest": a.dest, "nargs": a.nargs}
        for a in parser._actions
        if a.option_strings and a.dest != "help"
    ]
    return {
        "sglang": importlib.metadata.version("sglang"),
        "allow_abbrev": parser.allow_abbrev,
        "actions": actions,
    }


def field_blocks() -> dict[str, str]:
    """``--flag`` -> the source text of the field declaring it."""
    out: dict[str, str] = {}
    for source in (sglang_root() / "srt" / "arg_groups" / "fields").glob("*.py"):
        text = source.read_text()
        starts = list(FIELD.finditer(text))
        for index, here in enumerate(starts):
            end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
            out["--" + here.group(1).replace("_", "-")] = text[here.start() : end]
    return out


def test_option_table_is_sglangs_parser() -> None:
    if os.environ.get("KVR_UPDATE_GOLDEN"):
        OPTIONS_PATH.write_text(json.dumps(real_parser_table(), indent=1) + "\n")
        sglang_cli.option_table.cache_clear()
    table = sglang_cli.option_table()
    assert table["sglang"] == importlib.metadata.version("sglang")
    assert table["allow_abbrev"] is True  # SGLang keeps argparse's prefix matching
    options = {o for action in table["actions"] for o in action["options"]}
    source_text = "".join(p.read_text() for p in (sglang_root() / "srt").glob("**/*.py"))
    declared = (
        sglang_flags()
        | set(CLI_NAME.findall(source_text))
        | set(MANUAL.findall((sglang_root() / "srt" / "server_args.py").read_text()))
    )
    negated = {"--no-" + o.removeprefix("--") for o in declared}
    assert options - declared - negated == set(), "options SGLang's source does not declare"
    blocks = field_blocks()
    missing = sglang_flags() - options
    # A field has a CLI form when annotated ``A[...]`` without ``no_cli=True`` or a ``cli_name=``.
    unexplained = {
        flag
        for flag in missing
        if flag in blocks
        and blocks[flag].split(":", 1)[1].lstrip().startswith("A[")
        and "no_cli=True" not in blocks[flag]
        and "cli_name=" not in blocks[flag]
    }
    assert unexplained == set(), "fields with a CLI form that the table lacks"
    assert len(options) > 500


def test_managed_flags_resolve_to_their_own_setting() -> None:
    """Each rendered flag, and each of its aliases, names one SGLang setting in the table."""
    for flag in MANAGED_FLAGS:
        dest = sglang_cli.dest_of(flag)
        assert dest is not None, flag
        assert [o.dest for o in sglang_cli.parse_sglang_args([flag, "x"][: 1 + _takes(flag)])] == [
            dest
        ]


def _takes(flag: str) -> int:
    for action in sglang_cli.option_table()["actions"]:
        if flag in action["options"]:
            return 0 if action["nargs"] == 0 else 1
    raise AssertionError(flag)
