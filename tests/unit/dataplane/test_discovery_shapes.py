"""Model discovery's pure builders: what each listed name reaches, Anthropic's pages, and Codex's
catalog entries (the fields Codex 0.171.0 refuses a catalog without)."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.dataplane.frontend.discovery import (
    AnthropicPage,
    FleetModel,
    ListedModel,
    build_anthropic_page,
    build_codex_catalog,
    build_listed,
    fleet_model,
    parse_anthropic_page,
)
from kvretention.dataplane.frontend.errors import FrontendError

SERVED = ("qwen3-coder", "qwen3-small")
ALIASES = {"claude-haiku-4-5": "qwen3-small", "claude-*": "qwen3-coder", "gpt-*": "qwen3-coder"}


def test_listed_names_are_served_names_then_exact_aliases_with_what_they_reach() -> None:
    assert build_listed(SERVED, ALIASES) == (
        ListedModel("qwen3-coder", "qwen3-coder", ("claude-*", "gpt-*")),
        ListedModel("qwen3-small", "qwen3-small"),
        ListedModel("claude-haiku-4-5", "qwen3-small"),
    )


@pytest.mark.parametrize(
    ("model", "description"),
    [
        (ListedModel("m", "m"), "Served by this fleet."),
        (ListedModel("m", "m", ("claude-*",)), "Served by this fleet; also answers claude-*."),
        (ListedModel("claude-haiku-4-5", "m"), "Alias of m."),
        (ListedModel("m", "m", tuple(f"p{i}-*" for i in range(40))), None),
    ],
)
def test_descriptions_fit_claude_codes_hundred_characters(
    model: ListedModel, description: str | None
) -> None:
    assert len(model.description) <= 100
    if description is not None:
        assert model.description == description
    else:
        assert model.description.endswith("...")


NAMES = tuple(f"m{i}" for i in range(5))
MODELS = tuple(ListedModel(n, n) for n in NAMES)

# (page, ids, has_more)
PAGES: dict[str, tuple[AnthropicPage, list[str], bool]] = {
    "default_limit_takes_all_of_a_small_fleet": (AnthropicPage(), list(NAMES), False),
    "claude_codes_limit_1000": (AnthropicPage(limit=1000), list(NAMES), False),
    "first_page": (AnthropicPage(limit=2), ["m0", "m1"], True),
    "after_id": (AnthropicPage(limit=2, after_id="m1"), ["m2", "m3"], True),
    "last_page": (AnthropicPage(limit=2, after_id="m3"), ["m4"], False),
    "before_id_takes_the_page_just_before": (
        AnthropicPage(limit=2, before_id="m4"),
        ["m2", "m3"],
        True,
    ),
    "before_id_at_the_start": (AnthropicPage(limit=2, before_id="m1"), ["m0"], False),
    "unknown_cursor_is_an_empty_page": (AnthropicPage(after_id="nope"), [], False),
}


@pytest.mark.parametrize(("page", "ids", "has_more"), PAGES.values(), ids=PAGES.keys())
def test_anthropic_pages(page: AnthropicPage, ids: list[str], has_more: bool) -> None:
    body = build_anthropic_page(MODELS, page)
    assert [m["id"] for m in body["data"]] == ids
    assert body["has_more"] is has_more
    assert (body["first_id"], body["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
    for entry in body["data"]:
        assert entry["type"] == "model" and entry["display_name"] == entry["id"]
        assert entry["created_at"].endswith("Z")


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ({}, AnthropicPage()),
        ({"limit": "1000"}, AnthropicPage(limit=1000)),
        ({"limit": "1", "after_id": "a", "before_id": ""}, AnthropicPage(limit=1, after_id="a")),
    ],
)
def test_anthropic_query(query: dict[str, str], page: AnthropicPage) -> None:
    assert parse_anthropic_page(query) == page


@pytest.mark.parametrize("limit", ["0", "1001", "-3", "ten", ""])
def test_a_limit_out_of_range_is_a_400_naming_it(limit: str) -> None:
    with pytest.raises(FrontendError) as info:
        parse_anthropic_page({"limit": limit})
    assert info.value.status == 400 and info.value.message.startswith("limit: ")


CODEX_REQUIRED = {
    "slug": str,
    "display_name": str,
    "supported_reasoning_levels": list,
    "shell_type": str,
    "visibility": str,
    "supported_in_api": bool,
    "priority": int,
    "truncation_policy": dict,
    "support_verbosity": bool,
    "experimental_supported_tools": list,
    "base_instructions": str,
}
"""What Codex 0.171.0 refuses the whole catalog without (a missing field or a ``null`` one: serde;
``base_instructions`` or ``model_messages.instructions_template``), measured with
``codex debug models`` against a catalog served with ``model_catalog_url``."""


def test_codex_catalog_entries_carry_every_required_field_and_only_what_the_fleet_knows() -> None:
    catalog = build_codex_catalog(build_listed(SERVED, ALIASES), instructions="Be an agent.")
    entries: list[dict[str, Any]] = catalog["models"]
    assert [e["slug"] for e in entries] == ["qwen3-coder", "qwen3-small", "claude-haiku-4-5"]
    assert [e["priority"] for e in entries] == [0, 1, 2]  # the first served name is the default
    for entry in entries:
        for field, kind in CODEX_REQUIRED.items():
            assert isinstance(entry[field], kind), field
        assert entry["base_instructions"] == "Be an agent."
        assert entry["truncation_policy"] == {"mode": "bytes", "limit": 10_000}
        assert [level["effort"] for level in entry["supported_reasoning_levels"]] == [
            "low",
            "medium",
            "high",
        ]
        # nothing the fleet does not know, and nothing that would change Codex's tools or effort
        for absent in ("context_window", "default_reasoning_level", "minimal_client_version"):
            assert absent not in entry
        assert entry["apply_patch_tool_type"] is None
    assert entries[2]["description"] == "Alias of qwen3-small."


TEXT, BOTH = {"input_modalities": ["text"]}, {"input_modalities": ["text", "image"]}


@pytest.mark.parametrize(
    ("reports", "modalities", "window"),
    [
        pytest.param([], ("text", "image"), None, id="no-worker-says"),
        pytest.param([{}, {"role": "aggregated"}], ("text", "image"), None, id="older-workers"),
        pytest.param([BOTH], ("text", "image"), None, id="multimodal"),
        pytest.param([TEXT], ("text",), None, id="text-only"),
        pytest.param([BOTH, TEXT], ("text",), None, id="one-text-only-worker"),
        pytest.param([{}, TEXT], ("text",), None, id="an-older-beside-a-text-only"),
        pytest.param(
            [{**TEXT, "context_length": 32768}, {"context_length": 8192}],
            ("text",),
            8192,
            id="the-smallest-context",
        ),
        pytest.param(
            [{"context_length": None}, {"context_length": 0}, {"context_length": "big"}],
            ("text", "image"),
            None,
            id="no-usable-context",
        ),
    ],
)
def test_the_catalog_says_what_every_worker_reports_of_its_model(
    reports: list[dict[str, Any]], modalities: tuple[str, ...], window: int | None
) -> None:
    fleet = fleet_model(reports)
    assert fleet == FleetModel(input_modalities=modalities, context_window=window)
    catalog = build_codex_catalog(build_listed(SERVED, ALIASES), instructions="x", fleet=fleet)
    for entry in catalog["models"]:
        assert tuple(entry["input_modalities"]) == modalities
        assert entry.get("context_window") == window
        assert ("context_window" in entry) == (window is not None)
