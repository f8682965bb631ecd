"""The model's recommended sampling, read through SGLang 0.5.23's own model config as the engine
builds it from its server args: what SGLang's OpenAI server applies to unset fields, and what the
worker must apply itself because it calls the engine (``sampling_defaults_of``)."""

from __future__ import annotations

import json
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

from kvretention.dataplane.worker.engine import sampling_defaults_of

pytestmark = pytest.mark.engine

RECOMMENDED = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "do_sample": True}


def _model_dir(directory: Path, generation: dict[str, Any] | None) -> Path:
    """A model directory with a small Llama config and, when given, a generation config."""
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(str(directory))  # fmt: skip
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def _defaults(directory: Path, *args: str) -> dict[str, Any]:
    """``sampling_defaults_of`` an engine whose model config SGLang built from ``args``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's GPU-only modules warn on import
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path=str(directory), device="cpu", **_parsed(args))
    config = ModelConfig.from_server_args(server_args)
    engine = types.SimpleNamespace(tokenizer_manager=types.SimpleNamespace(model_config=config))
    return sampling_defaults_of(engine)


def _parsed(args: tuple[str, ...]) -> dict[str, str]:
    return {args[i].lstrip("-").replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}


@pytest.mark.parametrize(
    ("generation", "args", "expected"),
    [
        (RECOMMENDED, (), {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}),
        (RECOMMENDED, ("--sampling-defaults", "openai"), {}),
        ({"repetition_penalty": 1.05, "max_new_tokens": 99}, (), {"repetition_penalty": 1.05}),
        (None, (), {}),
    ],
    ids=["model (SGLang's default)", "openai", "only what SGLang takes", "no generation config"],
)
def test_the_models_generation_config_is_read_as_sglangs_server_reads_it(
    tmp_path: Path,
    generation: dict[str, Any] | None,
    args: tuple[str, ...],
    expected: dict[str, Any],
) -> None:
    assert _defaults(_model_dir(tmp_path, generation), *args) == expected
