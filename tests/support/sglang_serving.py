"""SGLang 0.5.23's own OpenAI and Anthropic servers, built over a test tokenizer with no engine
behind them, and this fleet's request path up to the engine call: the two sides the "like
SGLang" tests compare (``tests/unit/dataplane/test_*_like_sglang.py``).

Each side gives what the engine would be called with: the prompt's token ids, and the sampling
parameters as SGLang's ``SamplingParams`` holds them once its defaults are filled in.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.dataplane.worker.app import RequestRejected, plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine, sampling_defaults_of
from kvretention.dataplane.worker.parsing import ParserNames

PARSERS = ParserNames(tool_call_parser="qwen25", reasoning_parser="qwen3", model_type="llama")
EngineCall = tuple[list[int], dict[str, Any]]
"""The prompt's token ids and the engine's view of the sampling parameters."""
Outcome = EngineCall | str


def sglang_serving(tokenizer: Any, *, responses: bool = False) -> Any:
    """SGLang's OpenAI chat serving (``responses``: its Responses serving, which renders through
    the chat serving) over ``tokenizer`` and its template, as its server builds them
    (``TemplateManager.load_chat_template``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's GPU-only quantizers warn on import
        from sglang.srt.entrypoints.openai import serving_chat, serving_responses
        from sglang.srt.parser.template_manager import TemplateManager

    hf_config = types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"])
    config = {"tool_call_parser": PARSERS.tool_call_parser, "reasoning_parser": "qwen3"}
    manager = types.SimpleNamespace(
        config_value=config.get,
        tokenizer=tokenizer,
        model_config=types.SimpleNamespace(
            hf_config=hf_config, get_default_sampling_params=lambda: {}, is_multimodal=False
        ),
        server_args=None,
        served_model_name="m",
    )
    templates = TemplateManager()
    templates.load_chat_template(manager, None, "/no/model")
    serving = types.SimpleNamespace(default_chat_template_kwargs=None, enable_response_store=False)
    with pytest.MonkeyPatch.context() as patch:
        for module in (serving_chat, serving_responses):
            patch.setattr(module, "get_serving", lambda: serving)
        if not responses:
            return serving_chat.OpenAIServingChat(manager, templates)
        disagg = types.SimpleNamespace(disaggregation_mode="null")
        patch.setattr(serving_responses, "get_disagg", lambda: disagg)
        return serving_responses.OpenAIServingResponses(manager, templates)


def template_served(name: str | None = None, *, responses: bool = False) -> tuple[Any, Any]:
    """A test tokenizer with the real template ``name`` (``None``: the tiny model's own), and
    SGLang's serving over it (``responses``: its Responses serving)."""
    from support.chat_tokenizer import build_tokenizer
    from support.real_templates import TEMPLATES

    tokenizer = build_tokenizer()
    if name is not None:
        tokenizer.chat_template = TEMPLATES[name]()
    return tokenizer, sglang_serving(tokenizer, responses=responses)


def served_fixtures(*, responses: bool = False) -> tuple[Any, Any]:
    """A test module's ``served`` fixture (each real template with SGLang's serving over it, one
    module-scoped run each) and ``tiny`` (the tiny model's own template), as
    :func:`template_served` makes them; assign both as module globals."""
    from support.real_templates import TEMPLATES

    @pytest.fixture(scope="module", params=sorted(TEMPLATES))
    def served(request: pytest.FixtureRequest) -> tuple[Any, Any]:
        """A tokenizer with one of the real templates, and SGLang's serving over it."""
        return template_served(request.param, responses=responses)

    @pytest.fixture(scope="module")
    def tiny() -> tuple[Any, Any]:
        return template_served(responses=responses)

    return served, tiny


def processed(server: Any, request: Any, generation: dict[str, Any] | None = None) -> EngineCall:
    """SGLang's engine call for a ``ChatCompletionRequest``, as its chat server makes it
    (``generation``: the model's generation-config sampling, its ``default_sampling_params``)."""
    messages = server._process_messages(request, False)
    params = request.to_sampling_params(
        stop=messages.stop,
        model_generation_config=generation or {},
        tool_call_constraint=messages.tool_call_constraint,
    )
    return list(messages.prompt_ids), engine_view(params)


def responses_processed(server: Any, body: dict[str, Any]) -> EngineCall:
    """SGLang's engine call for a ``/v1/responses`` body, as its Responses server makes it."""
    from sglang.srt.entrypoints.openai.protocol import ResponsesRequest

    request = ResponsesRequest.model_validate(copy.deepcopy(body))
    tokenizer = server.tokenizer_manager.tokenizer
    with tools_as_the_client_wrote_them():
        *_, messages = asyncio.run(server._make_request(request, None, tokenizer))
    params = request.to_sampling_params(
        default_params={}, stop=messages.stop, tool_call_constraint=messages.tool_call_constraint
    )
    if not messages.skip_special_tokens:  # re-applied by the server, as in create_responses
        params["skip_special_tokens"] = False
    return list(messages.prompt_ids), engine_view(params)


def planned(tokenizer: Any, parsed: Any, generation: dict[str, Any] | None = None) -> EngineCall:
    """This fleet's engine call for a request its frontend parsed: the wire, then the worker's
    ``plan_call`` (``generation`` as for :func:`processed`, read as the worker reads it)."""
    model_config = types.SimpleNamespace(get_default_sampling_params=lambda: dict(generation or {}))
    manager = types.SimpleNamespace(tokenizer=tokenizer, model_config=model_config)
    engine = LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager),
        name="test",
        dialect=Dialect.FLAT,
        parsers=PARSERS,
        sampling_defaults=sampling_defaults_of(types.SimpleNamespace(tokenizer_manager=manager)),
    )
    request = build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=None)
    call = plan_call(request.to_json_bytes(), headers={}, state_role="aggregated", engine=engine)
    return call.kwargs["input_ids"], engine_view(call.kwargs["sampling_params"])


def engine_view(params: dict[str, Any]) -> dict[str, Any]:
    """What the engine samples with: SGLang's ``SamplingParams`` with its defaults filled in,
    grammars read as JSON where they are JSON (the same value written either way)."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    given = {k: v for k, v in params.items() if v is not None}
    view = msgspec.structs.asdict(SamplingParams(**given))
    for key in ("json_schema", "structural_tag"):
        if isinstance(view.get(key), str):
            view[key] = json.loads(view[key])
    return view


def outcome(run: Callable[..., EngineCall], *args: Any) -> Outcome:
    """The engine call, or ``"refused"`` where the template refuses the conversation."""
    try:
        return run(*args)
    except (RequestRejected, ValueError):
        return "refused"


@contextlib.contextmanager
def tools_as_the_client_wrote_them(*, strict_false: bool = False) -> Iterator[None]:
    """SGLang's tool dumps without the fields the client did not set: ``defer_loading: null``,
    and (``strict_false``) the ``strict: false`` its Anthropic adapter writes."""
    from sglang.srt.entrypoints.openai.protocol import Tool

    dump = Tool.model_dump

    def unset_dropped(tool: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = dump(tool, *args, **kwargs)
        if data.get("defer_loading") is None:
            data.pop("defer_loading", None)
        if strict_false and data.get("function", {}).get("strict") is False:
            del data["function"]["strict"]
        return data

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tool, "model_dump", unset_dropped)
        yield
