"""``kvretention tiny-model``: a tiny Llama the project builds itself, for SGLang's real engine on CPU.

No model hub is reachable where the tests, the demo and the CPU worker image are built, so the
model is made here: a byte-level BPE tokenizer trained with ``tokenizers`` on text written below,
the Qwen 2.5-style chat template of :mod:`~kvretention.dataplane.worker.cpu.chat_format` (tools,
tool calls and reasoning in the formats SGLang's ``qwen25`` and ``qwen3`` parsers read), and a
2-layer Llama with random weights from a fixed seed, saved with ``save_pretrained``. Its answers
are noise on purpose: what it is for is the engine around it (tokenizer manager, scheduler, radix
cache, plugins), so tests assert structure, token counts and SGLang's ``cached_tokens``, never text.
The same seed and corpus give the same files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click

from kvretention.dataplane.worker.cpu.chat_format import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_chat_tokenizer,
)

SERVED_NAME: Final = "kvr-tiny"
"""The name the tiny model is served under (``--served-model-name``) in the demo and tests."""
STAMP_FILE: Final = "kvr-tiny-model.json"
"""Written last, with the build's parameters: a directory without it is an unfinished build."""

_TEXT: Final = (
    "the a an of to in and for you are is it this that with on as be by at or from not we can "
    "system user assistant tool tools function call calls result results answer question reply "
    "please tell me what how why where when which file files read write edit run command shell "
    "bash python code test tests error errors line lines path name type string number integer "
    "boolean object array null true false description properties required arguments parameters "
    "content text message messages role model cache prefix token tokens retention radix tree "
    "engine server request response session conversation hello world quick brown fox jumps over "
    "lazy dog search list find grep directory git commit diff patch apply output input value"
)
_WORDS: Final = _TEXT.split(" ")
_SNIPPETS: Final = (
    '{"type": "function", "function": {"name": "read_file", "description": "Read a file.", '
    '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}, '
    '"required": ["path"]}}}',
    '{"name": "shell", "arguments": {"command": ["bash", "-lc", "ls -la"]}}',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<tool_response>\nfile contents: def main():\n    return 0\n</tool_response>",
    "<think>\nThe user wants the answer.\n</think>\n\n",
    "You are a helpful assistant. Answer the question.",
)


@dataclass(frozen=True)
class TinyModelConfig:
    """The model's shape: small enough to serve on two cores, big enough for agent prompts."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    context: int = 65536
    seed: int = 0
    answer_tokens: int = 24
    """About how long a sampled answer runs before the end-of-turn token: agents ask for up to
    32k tokens, and a random model would use them all (minutes of decode on two cores)."""
    dtype: str = "float32"
    """float32: CPUs without bf16 units run it faster, and the KV pool stays small (1 KiB a token)."""


def training_corpus() -> list[str]:
    """Deterministic text to train the tokenizer's merges on (words, JSON, the chat format)."""
    lines = [" ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(24)) for i in range(600)]
    lines += list(_SNIPPETS) * 20
    lines.append(CHAT_TEMPLATE)
    return lines


def build_tokenizer(config: TinyModelConfig = TinyModelConfig()) -> Any:
    """A ``transformers`` fast tokenizer: byte-level BPE (any text round-trips) with trained merges,
    the chat format's special and added tokens, and its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    reserved = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size - reserved,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(training_corpus(), trainer)
    return build_chat_tokenizer(core)


def build_model(tokenizer: Any, config: TinyModelConfig = TinyModelConfig()) -> Any:
    """A Llama with random weights drawn from ``config.seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.context,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(llama)
    _end_turns_early(model, eos=int(tokenizer.eos_token_id), config=config)
    return model.to(getattr(torch, config.dtype))


_ANCHOR: Final = 10.0
"""Every token's embedding carries this in hidden dimension 0, far above the random weights."""


def _end_turns_early(model: Any, *, eos: int, config: TinyModelConfig) -> None:
    """Make the end-of-turn token about ``1 / answer_tokens`` likely at each sampled step.

    Hidden dimension 0 carries a constant through the residual stream, so after the final RMS norm
    it is about ``sqrt(hidden_size)`` whatever the tokens; the end-of-turn token's output row reads
    only that dimension, with the logit that gives it the wanted share against the near-uniform
    rest of the vocabulary. Greedy decoding therefore ends at once; sampling ends after about
    ``answer_tokens`` tokens.
    """
    import math

    import torch

    logit = math.log((config.vocab_size - 1) / max(config.answer_tokens - 1, 1))
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = _ANCHOR
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[eos].zero_()
        head[eos, 0] = logit / math.sqrt(config.hidden_size)


def is_built(directory: Path) -> bool:
    """Whether ``directory`` holds a finished tiny model (its stamp is written last)."""
    return (directory / STAMP_FILE).is_file()


def save(directory: Path, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Write tokenizer, config and weights to ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STAMP_FILE).unlink(missing_ok=True)
    tokenizer = build_tokenizer(config)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, model {config.vocab_size}")
    tokenizer.save_pretrained(str(directory))
    build_model(tokenizer, config).save_pretrained(str(directory), safe_serialization=True)
    # transformers writes the weights owner-only (0600); an image builds the model as root for a
    # server that runs as another user, which would then find no weights.
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)
    (directory / STAMP_FILE).write_text(
        json.dumps({"served_name": SERVED_NAME, **config.__dict__}, sort_keys=True) + "\n"
    )
    return directory


@click.command("tiny-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, help="Seed for the random weights.")
@click.option("--force", is_flag=True, help="Build again even if DIRECTORY holds a finished one.")
def tiny_model_cmd(directory: Path, seed: int, force: bool) -> None:
    """Build the tiny random Llama that SGLang's real engine serves on CPU into DIRECTORY."""
    if is_built(directory) and not force:
        click.echo(f"tiny model already built in {directory}")
        return
    save(directory, TinyModelConfig(seed=seed))
    click.echo(f"tiny model saved to {directory}")
