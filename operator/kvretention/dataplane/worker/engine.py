"""Loads the engine the worker serves: real ``sglang.Engine`` or the in-package stand-in.

``--engine sglang`` builds ``sglang.Engine`` from the SGLang server arguments given after ``--``
(``--model-path``, ``--tp-size``, HiCache flags, ...), adding the disaggregation flags the worker's
role implies: the worker alone decides those (the operator renders ``--role``, not SGLang's flags). ``--engine standin:<dialect>`` loads :mod:`kvretention.dataplane.worker.standin`.
Either way the dialect is measured from the loaded engine, never assumed, and SGLang's own
``--tool-call-parser`` / ``--reasoning-parser`` flags in that argv select the output parsers (an
unknown name fails here, at start, listing the names SGLang knows).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kvretention.api.names import Role
from kvretention.dataplane.worker.cpu.flags import (
    CPU_ENGINE_ENV,
    HICACHE_UNAVAILABLE,
    CpuEngineUnsupported,
    Device,
    DeviceChoice,
    choose_device,
    plan_cpu_argv,
)
from kvretention.dataplane.worker.dialect import (
    VERSIONED_DECODER,
    VERSIONED_MODULE,
    Dialect,
    detect_dialect,
    parameter_names,
)
from kvretention.dataplane.worker.parsing import (
    ParserConfigError,
    ParserNames,
    check_parser_names,
    parser_names_from_argv,
)
from kvretention.retention import EVICTION_POLICY

logger = logging.getLogger(__name__)

STANDIN_PREFIX: Final = "standin:"
_POLICY_FLAG: Final = "--radix-eviction-policy"
TRANSFER_BACKEND: Final = "mooncake"
"""SGLang's KV transfer engine between prefill and decode (the fleet's Mooncake)."""


class EngineLoadError(RuntimeError):
    """The ``--engine`` value or the engine's arguments cannot give a usable engine."""


@dataclass(frozen=True)
class LoadedEngine:
    """An engine with what the worker must know about it."""

    engine: Any
    name: str
    dialect: Dialect
    incremental_stream: bool = False
    """SGLang's ``--incremental-streaming-output``: stream chunks carry deltas, not cumulative text."""
    parsers: ParserNames = field(default_factory=ParserNames)
    """SGLang's tool-call and reasoning parser names from the engine argv."""
    device: Device | None = None
    """Where the real engine runs (``None`` for the stand-in)."""
    left_out: tuple[str, ...] = ()
    """SGLang flags the worker did not pass on this device (HiCache on CPU), with
    :attr:`left_out_reason`."""
    left_out_reason: str = ""
    sampling_defaults: Mapping[str, Any] = field(default_factory=dict)
    """The model's recommended sampling (its ``generation_config.json``, under SGLang's
    ``--sampling-defaults model``, SGLang's default), for what a request leaves unset."""

    def abort(self, rid: str) -> None:
        """Abort an in-flight request (``Engine`` has no abort of its own; its tokenizer manager does)."""
        manager = getattr(self.engine, "tokenizer_manager", None)
        if manager is not None:
            manager.abort_request(rid=rid)

    @property
    def tokenizer(self) -> Any:
        manager = getattr(self.engine, "tokenizer_manager", None)
        return getattr(manager, "tokenizer", None)

    @property
    def takes_images(self) -> bool:
        """Whether the engine reads a request's images: SGLang builds a multimodal processor only
        for a multimodal model, and without one it drops ``image_data`` without a word."""
        manager = getattr(self.engine, "tokenizer_manager", None)
        return getattr(manager, "mm_processor", None) is not None

    @property
    def truncates_long_prompts(self) -> bool:
        """SGLang's ``--allow-auto-truncate``: a prompt longer than the context is cut, not refused."""
        manager = getattr(self.engine, "tokenizer_manager", None)
        return bool(getattr(manager, "allow_auto_truncate", False))

    @property
    def context_length(self) -> int | None:
        """Tokens a request may span, prompt and answer, less what SGLang reserves (``None``:
        the engine does not say)."""
        manager = getattr(self.engine, "tokenizer_manager", None)
        length = getattr(manager, "context_len", None)
        if not isinstance(length, int):
            return None
        reserved = getattr(manager, "num_reserved_tokens", 0)
        return length - (reserved if isinstance(reserved, int) else 0)

    def shutdown(self) -> None:
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()


def build_sglang_argv(
    passthrough: Sequence[str],
    *,
    role: Role,
    bootstrap_port: int | None,
    ib_device: str | None = None,
) -> list[str]:
    """SGLang server argv: the user's flags plus the disaggregation flags the role implies.

    Prefill and decode get ``--disaggregation-mode`` and the Mooncake transfer backend; prefill
    also its bootstrap port; both the RDMA device when one is named. Flags the user gave
    explicitly win; the worker only fills in what is missing.
    """
    argv = list(passthrough)
    if role == "aggregated":
        return argv
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    wanted: list[tuple[str, str | int | None]] = [
        ("--disaggregation-mode", role),
        ("--disaggregation-transfer-backend", TRANSFER_BACKEND),
        ("--disaggregation-bootstrap-port", bootstrap_port if role == "prefill" else None),
        ("--disaggregation-ib-device", ib_device),
    ]
    for flag, value in wanted:
        if value is not None and flag not in given:
            argv += [flag, str(value)]
    return argv


def has_versioned_decoder() -> bool:
    """Whether the installed SGLang ships ``kv_hints.decode_kv_hints_envelope``."""
    try:
        module = importlib.import_module(VERSIONED_MODULE)
    except ImportError:
        from kvretention.dataplane.worker.sglang_source import (
            has_versioned_decoder_source,
            locate_sglang,
        )

        root = locate_sglang()
        return root is not None and has_versioned_decoder_source(root)
    return callable(getattr(module, VERSIONED_DECODER, None))


def load_engine(
    spec: str, *, server_argv: Sequence[str], role: Role, device: DeviceChoice = "auto"
) -> LoadedEngine:
    """Build the engine named by ``--engine``, measure its dialect, check its parser names.

    ``device`` places the real engine: ``auto`` is the GPU when torch sees one, else the CPU."""
    parsers = parser_names_from_argv(server_argv)
    try:
        check_parser_names(parsers)
    except ParserConfigError as exc:
        raise EngineLoadError(str(exc)) from None
    if spec.startswith(STANDIN_PREFIX):
        return replace(
            _load_standin(spec.removeprefix(STANDIN_PREFIX), server_argv), parsers=parsers
        )
    if spec == "sglang":
        loaded = _load_sglang(server_argv, device=device)
        return replace(
            loaded,
            parsers=replace(parsers, model_type=model_type_of(loaded.engine)),
            sampling_defaults=sampling_defaults_of(loaded.engine),
        )
    raise EngineLoadError(f"unknown --engine {spec!r}: use 'sglang' or 'standin:<dialect>'")


def model_type_of(engine: Any) -> str | None:
    """The served model's ``model_type`` from SGLang's model config (``None``: not known)."""
    manager = getattr(engine, "tokenizer_manager", None)
    config = getattr(getattr(manager, "model_config", None), "hf_config", None)
    model_type = getattr(config, "model_type", None)
    return model_type if isinstance(model_type, str) else None


SAMPLING_DEFAULT_KEYS: Final = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
)
"""What SGLang's OpenAI server takes from the model's generation config (0.5.23
``ModelConfig.get_default_sampling_params``)."""


def sampling_defaults_of(engine: Any) -> dict[str, Any]:
    """The sampling SGLang's own OpenAI server would use for what a request leaves unset: the
    engine applies no such defaults itself (its server's ``to_sampling_params`` does), so the
    worker, which calls the engine, must. Empty under ``--sampling-defaults openai`` or when the
    model has no generation config."""
    manager = getattr(engine, "tokenizer_manager", None)
    read = getattr(getattr(manager, "model_config", None), "get_default_sampling_params", None)
    if read is None:
        return {}
    defaults = read()
    if not isinstance(defaults, dict):
        return {}
    return {k: v for k, v in defaults.items() if k in SAMPLING_DEFAULT_KEYS and v is not None}


def _load_standin(dialect_name: str, server_argv: Sequence[str] = ()) -> LoadedEngine:
    from kvretention.dataplane.worker.standin import STANDINS, StandinConfig

    try:
        cls = STANDINS[Dialect(dialect_name)]
    except ValueError:
        choices = ", ".join(d.value for d in Dialect)
        raise EngineLoadError(
            f"unknown stand-in dialect {dialect_name!r}; one of {choices}"
        ) from None
    try:
        engine: Any = cls(StandinConfig.from_argv(server_argv))
    except (OSError, ValueError, ImportError) as exc:
        raise EngineLoadError(f"stand-in cannot load its tokenizer: {exc}") from exc
    dialect = detect_dialect(
        parameter_names(engine.async_generate),
        has_versioned_decoder=cls.has_versioned_decoder,
    )
    return LoadedEngine(engine=engine, name=f"standin:{dialect_name}", dialect=dialect)


def parse_server_args(server_argv: Sequence[str]) -> Any:
    """SGLang's ``ServerArgs`` for ``server_argv``, parsed as ``sglang.launch_server`` does: its
    plugins first (they may add parser choices, e.g. the retention plugin's
    ``--radix-eviction-policy kvretain``), then its own parser."""
    from sglang.srt.server_args import prepare_server_args

    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:  # an SGLang without the plugin framework
        pass
    else:
        load_plugins()
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES

    return prepare_server_args(without_unloaded_policy(server_argv, RADIX_EVICTION_POLICY_CHOICES))


def without_unloaded_policy(server_argv: Sequence[str], choices: Sequence[str]) -> list[str]:
    """``server_argv`` minus ``--radix-eviction-policy kvretain`` when the retention plugin did not
    load (not installed, left out of ``SGLANG_PLUGINS``, failed): SGLang would refuse the choice
    and the worker would crash-loop. It serves with SGLang's default policy instead, says so in its
    log, and the probe's report makes the fleet's ``RetentionApplied`` False with the reason."""
    argv = list(server_argv)
    if EVICTION_POLICY in choices:
        return argv
    kept: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == _POLICY_FLAG and i + 1 < len(argv) and argv[i + 1] == EVICTION_POLICY:
            i += 2
            continue
        if arg == f"{_POLICY_FLAG}={EVICTION_POLICY}":
            i += 1
            continue
        kept.append(arg)
        i += 1
    if len(kept) != len(argv):
        logger.error(
            "%s %s needs the kvretention plugin, which SGLang did not load: serving with SGLang's "
            "default eviction policy, kv.retain is not applied in the radix tiers",
            _POLICY_FLAG,
            EVICTION_POLICY,
        )
    return kept


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError as exc:
        raise EngineLoadError(f"--engine sglang needs torch installed: {exc}") from exc
    return bool(torch.cuda.is_available())


def _load_sglang(server_argv: Sequence[str], *, device: DeviceChoice) -> LoadedEngine:
    placed = choose_device(device, cuda_available=device != "cpu" and _cuda_available())
    left_out: list[str] = []
    if placed == "cpu":
        # Before SGLang is imported: its modules read this at import time, and its scheduler
        # and detokenizer processes inherit it.
        os.environ[CPU_ENGINE_ENV] = "1"
        try:
            plan = plan_cpu_argv(server_argv)
        except CpuEngineUnsupported as exc:
            raise EngineLoadError(f"CPU engine: {exc}") from None
        server_argv, left_out = plan.argv, plan.dropped
        if left_out:
            logger.warning(
                "CPU engine: leaving out %s: %s", " ".join(left_out), HICACHE_UNAVAILABLE
            )
    try:
        import sglang

        server_args = parse_server_args(server_argv)
    except ImportError as exc:
        raise EngineLoadError(f"--engine sglang needs SGLang installed: {exc}") from exc
    engine = sglang.Engine(server_args=server_args)
    node_rank = int(getattr(server_args, "node_rank", 0) or 0)
    if node_rank >= 1:
        # A non-zero rank of a multinode worker: SGLang's engine served its own health endpoint
        # and blocked in its schedulers until they exited (the leader went away). Exit, so the
        # group is recreated as a whole (LeaderWorkerSet RecreateGroupOnPodRestart).
        raise EngineLoadError(f"node rank {node_rank}: SGLang's schedulers exited")
    dialect = detect_dialect(
        parameter_names(engine.async_generate), has_versioned_decoder=has_versioned_decoder()
    )
    return LoadedEngine(
        engine=engine,
        name=f"sglang-{getattr(sglang, '__version__', 'unknown')}",
        dialect=dialect,
        incremental_stream=bool(getattr(server_args, "incremental_streaming_output", False)),
        device=placed,
        left_out=tuple(left_out),
        left_out_reason=HICACHE_UNAVAILABLE if left_out else "",
    )
