"""CPU of resolving prefix breakpoints to token offsets, next to rendering and tokenizing the prompt.

A ~200 KB Claude Code-shaped conversation (17 tools with schemas, a billing block and two ``1h``
system blocks, 60 turns of tool calls and results, the newest tool result marked ``5m``) rendered
with a tool-aware Qwen-style template and a real BPE fast tokenizer
(``tests/support/retain_tokenizer.py``). Per request, in the same run, medians over repeats of
process CPU time: the prompt render, its tokenization with and without the offset mapping, and
``resolve_breakpoints`` for the request's markers.

    .venv/bin/python benchmarks/breakpoints_bench.py [--repeats 7] [--out benchmarks/results/breakpoints.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))

from kvretention.dataplane.breakpoints import resolve_breakpoints  # noqa: E402
from kvretention.dataplane.protocol import (  # noqa: E402
    ChatMessage,
    TextPart,
    ToolCall,
    ToolDefinition,
)
from support import retain_tokenizer  # noqa: E402


def claude_code_conversation(turns: int) -> tuple[list[ChatMessage], list[ToolDefinition]]:
    tools = [
        ToolDefinition(
            name=f"Tool{k}",
            description=f"Tool {k} does one thing well. " * 12,
            parameters={
                "type": "object",
                "properties": {
                    f"arg{i}": {"type": "string", "description": "An argument. " * 6}
                    for i in range(6)
                },
                "required": ["arg0"],
            },
        )
        for k in range(17)
    ]
    system = ChatMessage(
        role="system",
        content=[
            TextPart(text="You are Claude Code, a CLI for coding. " * 120, retain_ttl=3600),
            TextPart(text="Project instructions: keep diffs small. " * 80, retain_ttl=3600),
        ],
    )
    messages = [system, ChatMessage(role="user", content="Fix the failing test in pkg/. " * 10)]
    for t in range(turns):
        messages.append(
            ChatMessage(
                role="assistant",
                content=f"Step {t}: reading the next file.",
                tool_calls=[ToolCall(id=f"c{t}", name="Tool1", arguments='{"arg0": "pkg/a.py"}')],
            )
        )
        messages.append(
            ChatMessage(
                role="tool", tool_call_id=f"c{t}", content=f"{t}: def f(x):\n    return x\n" * 80
            )
        )
    messages[-1] = messages[-1].model_copy(update={"retain_ttl": 300})
    return messages, tools


def _cpu(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "breakpoints.json")
    args = parser.parse_args()

    tokenizer = retain_tokenizer.build_tokenizer()
    messages, tools = claude_code_conversation(args.turns)
    prompt = retain_tokenizer.render(tokenizer, messages, tools, add_generation_prompt=True)
    offsets = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    prefix_render = partial(retain_tokenizer.render, tokenizer, add_generation_prompt=False)

    def resolve() -> Any:
        return resolve_breakpoints(
            messages, tools, render=prefix_render, prompt=prompt, offsets=offsets, expected=3
        )

    resolution = resolve()
    assert not resolution.dropped and len(resolution.resolved) == 3
    row = {
        "prompt_chars": len(prompt),
        "prompt_tokens": len(offsets),
        "markers": len(resolution.resolved),
        "render_ms": _cpu(
            lambda: retain_tokenizer.render(tokenizer, messages, tools, add_generation_prompt=True),
            args.repeats,
        ),
        "tokenize_ms": _cpu(
            lambda: tokenizer.encode(prompt, add_special_tokens=False), args.repeats
        ),
        "tokenize_with_offsets_ms": _cpu(
            lambda: tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True),
            args.repeats,
        ),
        "resolve_ms": _cpu(resolve, args.repeats),
    }
    row["resolve_vs_render"] = row["resolve_ms"] / row["render_ms"]
    row["resolve_vs_render_and_tokenize"] = row["resolve_ms"] / (
        row["render_ms"] + row["tokenize_ms"]
    )
    result = {"machine": platform.machine(), "python": platform.python_version(), "rows": [row]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        "| prompt | tokens | markers | render ms | tokenize ms | + offsets ms | resolve ms "
        "| resolve / render | resolve / (render + tokenize) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {row['prompt_chars'] / 1000:.0f} KB | {row['prompt_tokens']} | {row['markers']} "
        f"| {row['render_ms']:.1f} | {row['tokenize_ms']:.1f} "
        f"| {row['tokenize_with_offsets_ms']:.1f} | {row['resolve_ms']:.1f} "
        f"| {row['resolve_vs_render']:.2f}x | {row['resolve_vs_render_and_tokenize']:.2f}x |"
    )


if __name__ == "__main__":
    main()
