"""``spec.model``: the model the workers serve, where its weights come from, and its parsers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from kvretention.api.base import WireModel, cel_config, list_field, require

__all__ = [
    "ModelAlias",
    "ModelSpec",
    "ModelVolume",
    "ReasoningParserName",
    "ToolCallParser",
]


_ONE_VOLUME_SOURCE_MESSAGE = "model.volume needs exactly one of claimName or hostPath"


class ModelVolume(WireModel):
    """Where the weights live when ``model.path`` is a file path rather than a hub id."""

    model_config = cel_config(
        ("has(self.claimName) != has(self.hostPath)", _ONE_VOLUME_SOURCE_MESSAGE)
    )

    claim_name: str | None = Field(
        default=None,
        max_length=253,
        description="A PersistentVolumeClaim in the CR's namespace holding the weights.",
    )
    host_path: str | None = Field(
        default=None,
        max_length=4096,
        description="A directory on the node holding the weights (single-node and test setups).",
    )
    mount_path: str = Field(
        default="/models",
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description="Where the volume is mounted read-only in worker containers.",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> ModelVolume:
        require((self.claim_name is None) != (self.host_path is None), _ONE_VOLUME_SOURCE_MESSAGE)
        return self


ModelAlias = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9*][A-Za-z0-9._/:@\[\]*-]*$",
        description=(
            "A model name as clients send it, or a pattern: `*` stands for any run of characters "
            "(`claude-*`), every other character is literal."
        ),
    ),
]

ToolCallParser = Literal[
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32",
    "deepseekv4", "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon",
    "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3", "mimo", "minicpm5", "mistral", "muse",
    "poolside_v1", "pythonic", "qwen", "qwen25", "qwen3_coder", "spark25", "step3", "step3p5",
    "minimax-m2", "minimax-m3", "nanbeige", "trinity", "interns1", "hermes", "hunyuan",
    "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1", "response_template",
]  # fmt: skip
"""SGLang 0.5.23's ``FunctionCallParser.ToolCallParserEnum`` keys (a unit test keeps them equal)."""

ReasoningParserName = Literal[
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots",
    "glm45", "ling3", "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo",
    "muse", "poolside_v1", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think",
    "minimax-m3", "nanbeige", "step3", "step3p5", "mistral", "nemotron_3",
    "granite_thinking_parser", "interns1", "gemma4", "gigachat35", "inkling", "iquest_q1",
    "cohere_command4", "response_template",
]  # fmt: skip
"""SGLang 0.5.23's ``ReasoningParser.DetectorMap`` keys (a unit test keeps them equal)."""


_ALIAS_NOT_NAME_MESSAGE = "model.aliases must not repeat model.name"


class ModelSpec(WireModel):
    """The model every worker serves."""

    model_config = cel_config(
        ("!has(self.aliases) || !(self.name in self.aliases)", _ALIAS_NOT_NAME_MESSAGE)
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="Served model name: the `model` clients put in requests (SGLang --served-model-name).",
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="Hugging Face id or path inside the worker container (SGLang --model-path).",
    )
    volume: ModelVolume | None = Field(
        default=None, description="Optional volume with the weights, mounted in every worker."
    )
    aliases: list[ModelAlias] = list_field(
        32,
        (
            "Other model names clients may send that the frontend serves with this model (for "
            "example Claude Code's small fast model or the names Codex is configured with); "
            "responses echo the name the client asked for. An alias with `*` is a pattern: `*` "
            "matches any run of characters, so `claude-*` and `gpt-*` take every name Claude Code "
            "and Codex send by default. Only exact aliases are listed by `/v1/models`."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    tool_call_parser: ToolCallParser | None = Field(
        default=None,
        description=(
            "SGLang tool-call parser for the model's native tool-call format (SGLang "
            "--tool-call-parser), e.g. qwen25, qwen3_coder, llama3, deepseekv3, kimi_k2, glm45, "
            "gpt-oss. Unset: tool calls are not parsed and requests with tools are refused."
        ),
    )
    reasoning_parser: ReasoningParserName | None = Field(
        default=None,
        description=(
            "SGLang reasoning parser that separates the model's thinking from its answer (SGLang "
            "--reasoning-parser), e.g. qwen3, deepseek-r1, kimi_k2, glm45, gpt-oss. Unset: "
            "thinking, if any, stays in the answer text."
        ),
    )

    @model_validator(mode="after")
    def _check_aliases(self) -> ModelSpec:
        require(self.name not in self.aliases, _ALIAS_NOT_NAME_MESSAGE)
        require(len(set(self.aliases)) == len(self.aliases), "model.aliases must be unique")
        return self
