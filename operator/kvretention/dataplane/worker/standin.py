"""The engine stand-in: ``sglang.Engine.async_generate``'s exact signature, recorded calls, no GPU.

The data-plane tier runs the real worker against this class. Each dialect has its own variant:
``none`` lacks the ``kv_hints`` parameter (SGLang before hints), ``flat`` takes the design's flat
envelope, ``versioned`` validates with SGLang's own ``decode_kv_hints_envelope`` when importable.
Streams look like SGLang's non-incremental stream: cumulative ``text``/``output_ids`` plus
``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` = the longest prefix
shared with an earlier prompt, as a prefix cache would report, ``reasoning_tokens``).

It reads SGLang's own server flags from the argv after ``--``: ``--tokenizer-path`` /
``--model-path`` naming a local Hugging Face tokenizer directory (then
``tokenizer_manager.tokenizer`` is that tokenizer, so the worker renders with its chat template)
and ``--tool-call-parser`` (the model family whose native tool-call format it answers in:
``qwen25`` / ``qwen`` — the default — or ``llama3``).

What it answers is chosen per request by markers in the prompt
(:mod:`kvretention.dataplane.worker.standin_reply`).

Environment knobs (read at construction) let tests in another process observe and break it:

- ``KVR_STANDIN_RECORD``: append every call (and abort) as one JSON line to this file;
- ``KVR_STANDIN_DELAY_S``: sleep this long before each chunk (in-flight requests for drain tests);
- ``KVR_STANDIN_FAIL``: ``start`` (error before the first chunk), ``midstream`` (error after it),
  ``die`` (the process exits after the first chunk, like a crashed worker);
- ``KVR_STANDIN_TEXT_ONLY``: set, the model reads text only (no multimodal processor, as SGLang
  has none for a text model).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

from kvretention.dataplane.worker.dialect import VERSIONED_DECODER, VERSIONED_MODULE, Dialect
from kvretention.dataplane.worker.standin_reply import plan_reply
from kvretention.hints.envelope import KvHintEnvelope

RECORD_ENV: Final = "KVR_STANDIN_RECORD"
DELAY_ENV: Final = "KVR_STANDIN_DELAY_S"
FAIL_ENV: Final = "KVR_STANDIN_FAIL"
TEXT_ONLY_ENV: Final = "KVR_STANDIN_TEXT_ONLY"

FIRST_TOKEN_ID: Final = 1000
DIE_EXIT_CODE: Final = 17
CACHE_PROMPTS: Final = 64


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class StandinConfig:
    record_path: str | None = None
    delay_s: float = 0.0
    fail: str | None = None
    text_only: bool = False
    tokenizer_path: str | None = None
    """A local Hugging Face tokenizer directory (``--tokenizer-path`` / ``--model-path``)."""
    tool_format: str = "qwen25"
    """The native tool-call format it answers in (``--tool-call-parser``)."""
    thinks: bool = False
    """A thinking model (``--reasoning-parser`` given): every answer opens with a think block,
    empty unless ``[[standin:reasoning]]`` asks for reasoning, and none when the prompt closed
    the block itself (thinking switched off)."""
    server_argv: tuple[str, ...] = field(default=())

    @classmethod
    def from_argv(cls, argv: Sequence[str], env: dict[str, str] | None = None) -> StandinConfig:
        """Environment knobs plus the SGLang server flags the stand-in honours."""
        flags = _flags(argv)
        tokenizer = flags.get("--tokenizer-path") or flags.get("--model-path")
        tool_format = "llama3" if flags.get("--tool-call-parser") == "llama3" else "qwen25"
        return replace(
            cls.from_env(env),
            tokenizer_path=tokenizer,
            tool_format=tool_format,
            thinks=bool(flags.get("--reasoning-parser")),
            server_argv=tuple(argv),
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StandinConfig:
        source = os.environ if env is None else env
        return cls(
            record_path=source.get(RECORD_ENV) or None,
            delay_s=float(source.get(DELAY_ENV) or 0.0),
            fail=source.get(FAIL_ENV) or None,
            text_only=bool(source.get(TEXT_ONLY_ENV)),
        )


def _flags(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            out[key] = value
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[arg] = args[i + 1]
    return out


class StandinEngineError(RuntimeError):
    """The failure ``KVR_STANDIN_FAIL`` asks for."""


class _Recorder:
    """Keeps calls in memory and, when configured, appends them to a JSONL file."""

    def __init__(self, path: str | None) -> None:
        self.calls: list[dict[str, Any]] = []
        self._path = path
        self._lock = threading.Lock()

    def add(self, entry: dict[str, Any]) -> None:
        entry = {"pid": os.getpid(), **entry}
        with self._lock:
            self.calls.append(entry)
            if self._path:
                with open(self._path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry, sort_keys=True) + "\n")


class StandinTokenizerManager:
    """The slice of SGLang's ``TokenizerManager`` the worker uses: ``tokenizer`` and aborts."""

    tokenizer: Any = None
    """No tokenizer unless one is configured: the worker then falls back to its documented plain
    chat rendering."""
    mm_processor: Any = "standin"
    """Present, as on a multimodal model: the stand-in takes ``image_data`` and records it."""

    def __init__(self, recorder: _Recorder, tokenizer: Any = None) -> None:
        self._recorder = recorder
        self.tokenizer = tokenizer
        self.aborted: set[str] = set()

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.add(rid)
        self._recorder.add({"event": "abort", "rid": rid, "abort_all": abort_all})


class _StandinBase:
    """Shared behaviour; subclasses only differ in ``async_generate``'s signature and validation."""

    dialect: ClassVar[Dialect]
    has_versioned_decoder: ClassVar[bool] = False
    """Whether this variant ships SGLang's versioned ``decode_kv_hints_envelope`` (dialect detection)."""

    def __init__(self, config: StandinConfig | None = None, *, tokenizer: Any = None) -> None:
        self.config = config or StandinConfig.from_env()
        self._recorder = _Recorder(self.config.record_path)
        if tokenizer is None and self.config.tokenizer_path:
            tokenizer = _load_tokenizer(self.config.tokenizer_path)
        self.tokenizer_manager = StandinTokenizerManager(self._recorder, tokenizer)
        if self.config.text_only:
            self.tokenizer_manager.mm_processor = None
        self._prompts: dict[str | None, list[list[int]]] = {}
        """Recent prompts per ``cache_salt``: SGLang's radix tree never matches across salts."""

    def _prompt_text(self, arguments: dict[str, Any]) -> str:
        prompt = arguments.get("prompt")
        if isinstance(prompt, str):
            return prompt
        ids = arguments.get("input_ids")
        tokenizer = self.tokenizer_manager.tokenizer
        if isinstance(ids, list) and tokenizer is not None:
            return str(tokenizer.decode(ids, skip_special_tokens=False))
        return ""

    def _cached_tokens(self, ids: Any, salt: str | None = None) -> int:
        """The longest prefix shared with an earlier prompt of the same ``cache_salt``, as
        SGLang's prefix cache reports."""
        if not isinstance(ids, list):
            return 0
        prompts = self._prompts.get(salt, [])
        cached = max((common_prefix(ids, p) for p in prompts), default=0)
        self._prompts[salt] = [*prompts[-(CACHE_PROMPTS - 1) :], list(ids)]
        return cached

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self._recorder.calls

    def _validate_kv_hints(self, kv_hints: dict[str, Any]) -> None:
        """Raise ``ValueError`` as the engine would for a hint it cannot take."""

    def _start(self, arguments: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        passed = {k: v for k, v in arguments.items() if k != "self" and v != _DEFAULTS.get(k)}
        kv_hints = arguments.get("kv_hints")
        self._recorder.add(
            {
                "event": "generate",
                "dialect": str(self.dialect),
                "rid": arguments.get("rid"),
                "kv_hints_passed": kv_hints is not None,
                "kwargs": _jsonable(passed),
            }
        )
        return self._stream(arguments, kv_hints)

    async def _stream(
        self, arguments: dict[str, Any], kv_hints: dict[str, Any] | None
    ) -> AsyncIterator[dict[str, Any]]:
        # Like SGLang, request validation happens when the generator first runs.
        if kv_hints:
            self._validate_kv_hints(kv_hints)
        if self.config.fail == "start":
            raise StandinEngineError("stand-in told to fail before the first chunk")
        rid = str(arguments.get("rid") or "")
        sampling = arguments.get("sampling_params") or {}
        reply = plan_reply(
            self._prompt_text(arguments),
            sampling=sampling,
            tool_format=self.config.tool_format,
            thinks=self.config.thinks,
        )
        pieces = reply.pieces
        limit = sampling.get("max_new_tokens")
        count = len(pieces) if limit is None else min(int(limit), len(pieces))
        ids = arguments.get("input_ids")
        prompt_tokens = _prompt_tokens(arguments.get("prompt"), ids)
        cached = self._cached_tokens(ids, arguments.get("cache_salt") or None)
        text = ""
        output_ids: list[int] = []
        for i in range(count):
            if self.config.delay_s:
                await asyncio.sleep(self.config.delay_s)
            if rid in self.tokenizer_manager.aborted:
                return
            if i == 1 and self.config.fail == "midstream":
                raise StandinEngineError("stand-in told to fail mid-stream")
            if i == 1 and self.config.fail == "die":
                os._exit(DIE_EXIT_CODE)
            text += pieces[i]
            output_ids.append(FIRST_TOKEN_ID + i)
            finish: dict[str, Any] | None = None
            if i == count - 1:
                finish = (
                    {"type": "length", "length": count}
                    if count < len(pieces)
                    else {"type": "stop", "matched": FIRST_TOKEN_ID + count}
                )
            yield _output(
                rid,
                text=text,
                output_ids=output_ids,
                finish=finish,
                prompt_tokens=prompt_tokens,
                cached=cached,
                reasoning=min(reply.reasoning_pieces, len(output_ids)),
            )
        if count == 0:
            yield _output(
                rid,
                text="",
                output_ids=[],
                finish={"type": "length", "length": 0},
                prompt_tokens=prompt_tokens,
                cached=cached,
                reasoning=0,
            )


def _output(
    rid: str,
    *,
    text: str,
    output_ids: list[int],
    finish: dict[str, Any] | None,
    prompt_tokens: int,
    cached: int,
    reasoning: int,
) -> dict[str, Any]:
    """One cumulative stream output, shaped as SGLang's."""
    return {
        "text": text,
        "output_ids": list(output_ids),
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(output_ids),
            "cached_tokens": cached,
            "reasoning_tokens": reasoning,
        },
    }


def _load_tokenizer(path: str) -> Any:
    """A local tokenizer directory through transformers (no hub is contacted)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


class StandinEngineFlat(_StandinBase):
    """The design's SGLang: 0.5.23's exact signature, ``kv_hints`` is the flat envelope."""

    dialect = Dialect.FLAT

    def _validate_kv_hints(self, kv_hints: dict[str, Any]) -> None:
        KvHintEnvelope.from_wire(kv_hints)

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: Any = None,
        input_ids: Any = None,
        image_data: Any = None,
        audio_data: Any = None,
        video_data: Any = None,
        mm_hashes: Any = None,
        mm_content_hashes: Any = None,
        return_logprob: Any = False,
        logprob_start_len: Any = None,
        top_logprobs_num: Any = None,
        token_ids_logprob: Any = None,
        lora_path: Any = None,
        custom_logit_processor: Any = None,
        require_reasoning: bool = False,
        return_hidden_states: Any = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        stream: bool = False,
        bootstrap_host: Any = None,
        bootstrap_port: Any = None,
        bootstrap_room: Any = None,
        routed_dp_rank: Any = None,
        disagg_prefill_dp_rank: Any = None,
        kv_hints: dict[str, Any] | None = None,
        # Deprecated in SGLang: use routed_dp_rank instead
        data_parallel_rank: Any = None,
        external_trace_header: Any = None,
        rid: Any = None,
        session_params: Any = None,
        priority: Any = None,
        session_id: Any = None,
        *,
        cache_salt: Any = None,
    ) -> Any:
        return await _finish(self._start(dict(locals())), stream=stream)


def _without_kv_hints(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name != "kv_hints"]
    )


class StandinEngineNone(_StandinBase):
    """An SGLang from before ``kv_hints``: the 0.5.23 signature without that one parameter."""

    dialect = Dialect.NONE

    async def async_generate(self, *args: Any, **kwargs: Any) -> Any:
        # Bound against the signature below, so ``kv_hints`` is refused as the old engine would.
        bound = _NONE_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        return await _finish(self._start(arguments), stream=arguments["stream"])


_NONE_SIGNATURE: Final = _without_kv_hints(inspect.signature(StandinEngineFlat.async_generate))
StandinEngineNone.async_generate.__signature__ = _NONE_SIGNATURE  # type: ignore[attr-defined]


def _real_versioned_decoder() -> Callable[[Any], Any] | None:
    """SGLang's own decoder, executed from its file (importing the ``sglang`` package would pull
    in torch and cost seconds at every stand-in start), else imported."""
    from kvretention.dataplane.worker.sglang_source import load_kv_hints_module

    module: Any = load_kv_hints_module()
    if module is None:
        try:
            module = __import__(VERSIONED_MODULE, fromlist=[VERSIONED_DECODER])
        except Exception:  # no SGLang, or no torch for sglang/__init__.py
            module = None
    decoder = getattr(module, VERSIONED_DECODER, None)
    return decoder if callable(decoder) else None


def _fallback_versioned_decoder(value: Any) -> Any:
    """The 0.5.23 shape check, for environments without SGLang installed."""
    ok = (
        isinstance(value, dict)
        and isinstance(value.get("protocol_version"), str)
        and isinstance(value.get("message_id"), str)
        and isinstance(value.get("actions", []), list)
        and all(
            isinstance(a, dict)
            and all(
                isinstance(a.get(k), str) for k in ("action_id", "action_type", "action_version")
            )
            and isinstance(a.get("payload", {}), dict)
            for a in value.get("actions", [])
        )
    )
    if not ok:
        raise ValueError(f"Malformed kv_hints envelope: {value!r}")
    return value


_VERSIONED_DECODE: Final = _real_versioned_decoder() or _fallback_versioned_decoder


class StandinEngineVersioned(StandinEngineFlat):
    """SGLang 0.5.23 itself: ``kv_hints`` is the versioned actions envelope, checked by its decoder."""

    dialect = Dialect.VERSIONED
    has_versioned_decoder = True

    def _validate_kv_hints(self, kv_hints: dict[str, Any]) -> None:
        _VERSIONED_DECODE(kv_hints)


STANDINS: Final[dict[Dialect, type[_StandinBase]]] = {
    Dialect.NONE: StandinEngineNone,
    Dialect.FLAT: StandinEngineFlat,
    Dialect.VERSIONED: StandinEngineVersioned,
}


def _collect_defaults() -> dict[str, Any]:
    params = inspect.signature(StandinEngineFlat.async_generate).parameters
    return {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}


_DEFAULTS: Final = _collect_defaults()


async def _finish(gen: AsyncIterator[dict[str, Any]], *, stream: bool) -> Any:
    """SGLang returns the generator when streaming, else awaits the single final output."""
    if stream:
        return gen
    last: dict[str, Any] | None = None
    async for last in gen:  # noqa: B007 - the final cumulative output is the answer
        pass
    return last


def _prompt_tokens(prompt: Any, input_ids: Any) -> int:
    if isinstance(input_ids, list):
        return len(input_ids)
    return len(prompt.split()) if isinstance(prompt, str) else 0


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))
