"""Model discovery in the three shapes clients read from ``GET /v1/models``: OpenAI's list,
Anthropic's page (Claude Code's gateway discovery), and Codex's catalog (``model_catalog_url``).

Pure builders from the frontend's served names and aliases; ``app.models`` picks the shape from
the request (``client_version`` in the query: Codex; an ``anthropic-version`` header: Anthropic;
else OpenAI). Each listed name is one a client may send: served names, then exact aliases. An
alias pattern (``claude-*``) is not a name; it is named in the description of the served model it
reaches, where a picker shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import model_names
from kvretention.dataplane.frontend.errors import FrontendError

CODEX_QUERY: Final = "client_version"
"""Codex asks its ``model_catalog_url`` with ``?client_version=<its version>`` (0.171.0 checked)."""
ANTHROPIC_HEADER: Final = "anthropic-version"

ANTHROPIC_DEFAULT_LIMIT: Final = 20
ANTHROPIC_MAX_LIMIT: Final = 1000
"""Anthropic's page sizes; Claude Code asks ``limit=1000`` and reads the first page only."""
CREATED_AT: Final = "1970-01-01T00:00:00Z"
DESCRIPTION_CHARS: Final = 100
"""Claude Code cuts a gateway model's description at 100 characters."""

CODEX_REASONING_LEVELS: Final = (
    ("low", "Lighter reasoning"),
    ("medium", "Balanced reasoning"),
    ("high", "Deeper reasoning"),
)
"""The efforts ``reasoning.effort`` maps onto (docs/frontend.md, Responses fields)."""


@dataclass(frozen=True)
class ListedModel:
    """A name a client may send, the served model it reaches, and the alias patterns that also
    reach that model (served names only)."""

    id: str
    served: str
    patterns: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        if self.id != self.served:
            text = f"Alias of {self.served}."
        elif self.patterns:
            text = f"Served by this fleet; also answers {', '.join(self.patterns)}."
        else:
            text = "Served by this fleet."
        if len(text) > DESCRIPTION_CHARS:
            text = text[: DESCRIPTION_CHARS - 3] + "..."
        return text


def build_listed(served: Sequence[str], aliases: Mapping[str, str]) -> tuple[ListedModel, ...]:
    """Served names, then exact aliases, as :func:`model_names.listed` orders them."""
    patterns: dict[str, list[str]] = {}
    for alias, target in aliases.items():
        if model_names.is_pattern(alias):
            patterns.setdefault(target, []).append(alias)
    return tuple(
        ListedModel(
            id=name,
            served=model_names.resolve(name, served=served, aliases=aliases) or name,
            patterns=tuple(patterns.get(name, ())),
        )
        for name in model_names.listed(served, aliases)
    )


def build_openai_list(models: Sequence[ListedModel]) -> dict[str, Any]:
    data = [
        {"id": m.id, "object": "model", "created": 0, "owned_by": "kvretention"} for m in models
    ]
    return {"object": "list", "data": data}


@dataclass(frozen=True)
class AnthropicPage:
    """Anthropic's list parameters: ``limit`` (1-1000, default 20), ``after_id``, ``before_id``."""

    limit: int = ANTHROPIC_DEFAULT_LIMIT
    after_id: str | None = None
    before_id: str | None = None


def parse_anthropic_page(query: Mapping[str, str]) -> AnthropicPage:
    """The page a query asks for; a malformed ``limit`` is a 400 naming it."""
    raw = query.get("limit")
    limit = ANTHROPIC_DEFAULT_LIMIT
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            limit = 0
        if not 1 <= limit <= ANTHROPIC_MAX_LIMIT:
            raise FrontendError(
                status=400,
                code="invalid_request",
                message=f"limit: must be an integer from 1 to {ANTHROPIC_MAX_LIMIT}",
                param="limit",
            )
    return AnthropicPage(
        limit=limit,
        after_id=query.get("after_id") or None,
        before_id=query.get("before_id") or None,
    )


def build_anthropic_page(models: Sequence[ListedModel], page: AnthropicPage) -> dict[str, Any]:
    """Anthropic's model page: ``after_id`` pages forward, ``before_id`` back; a cursor that
    names no listed model gives an empty page."""
    ids = [m.id for m in models]
    start, stop = 0, len(models)
    if page.after_id is not None:
        start = ids.index(page.after_id) + 1 if page.after_id in ids else len(models)
    if page.before_id is not None:
        stop = ids.index(page.before_id) if page.before_id in ids else 0
    window = list(models[start:stop])
    if page.before_id is not None and page.after_id is None:
        chosen, has_more = window[-page.limit :], len(window) > page.limit
    else:
        chosen, has_more = window[: page.limit], len(window) > page.limit
    data = [
        {
            "type": "model",
            "id": m.id,
            "display_name": m.id,
            "created_at": CREATED_AT,
            "description": m.description,
        }
        for m in chosen
    ]
    return {
        "data": data,
        "has_more": has_more,
        "first_id": chosen[0].id if chosen else None,
        "last_id": chosen[-1].id if chosen else None,
    }


BOTH_MODALITIES: Final = ("text", "image")


@dataclass(frozen=True)
class FleetModel:
    """What the healthy workers report of the model they serve (their ``/v1/info``)."""

    input_modalities: tuple[str, ...] = BOTH_MODALITIES
    context_window: int | None = None
    """The fewest tokens a prompt may span on any of them; None when none says."""


def fleet_model(reports: Iterable[Mapping[str, object]]) -> FleetModel:
    """Images only when every worker that says takes them (a text-only model refuses them, and
    Codex then keeps a pasted screenshot out of the conversation); the smallest context any
    worker reports (Codex compacts before it). Both modalities and no window when none says
    (older workers, a router that did not answer)."""
    reports = list(reports)
    said = [m for r in reports if isinstance(m := r.get("input_modalities"), list)]
    windows = [w for r in reports if isinstance(w := r.get("context_length"), int) and w > 0]
    text_only = bool(said) and not all("image" in m for m in said)
    return FleetModel(
        input_modalities=("text",) if text_only else BOTH_MODALITIES,
        context_window=min(windows) if windows else None,
    )


def build_codex_catalog(
    models: Sequence[ListedModel], *, instructions: str, fleet: FleetModel = FleetModel()
) -> dict[str, Any]:
    """Codex's catalog (``{"models": [ModelInfo]}``) with only what the fleet knows of its models.

    ``instructions`` become each entry's ``base_instructions``: Codex sends them as the first
    developer message in place of its own prompt (checked with 0.171.0), so they are the fleet's
    choice (``--codex-instructions-file``), never made up here. ``context_window`` only when the
    workers report their engine's (Codex then compacts before a prompt overflows it); no speed
    tiers, no ``minimal_client_version``.
    """
    window = {} if fleet.context_window is None else {"context_window": fleet.context_window}
    entries = [
        {
            "slug": m.id,
            "display_name": m.id,
            "description": m.description,
            "supported_reasoning_levels": [
                {"effort": effort, "description": text} for effort, text in CODEX_REASONING_LEVELS
            ],
            "shell_type": "shell_command",
            "visibility": "list",
            "supported_in_api": True,
            "priority": index,
            "upgrade": None,
            "base_instructions": instructions,
            "supports_reasoning_summaries": False,
            "support_verbosity": False,
            "default_verbosity": None,
            "apply_patch_tool_type": None,
            "truncation_policy": {"mode": "bytes", "limit": 10_000},
            "supports_parallel_tool_calls": False,
            "experimental_supported_tools": [],
            "input_modalities": list(fleet.input_modalities),
            **window,
        }
        for index, m in enumerate(models)
    ]
    return {"models": entries}


def codex_catalog_not_configured() -> FrontendError:
    """Codex asked for its catalog and the fleet has no instructions to serve in it: a 404, on
    which Codex keeps its built-in metadata and prompt (checked with 0.171.0)."""
    return FrontendError(
        status=404,
        code="codex_catalog_not_configured",
        message=(
            "This server serves Codex's model catalog only with --codex-instructions-file "
            "(a catalog's instructions replace Codex's own prompt); GET /v1/models without "
            "client_version lists the models."
        ),
    )
