"""The worker's CPU per output token for parsing an answer with SGLang's tool-call parser.

The worker feeds every engine chunk to ``OutputParser`` (``dataplane/worker/output_parser.py``), which
runs SGLang's reasoning and tool-call detectors. Answers in the Qwen 2.5 format, streamed as an
engine sends them: one token (~4 characters, special tokens whole) per chunk, and 16 tokens per
chunk (an engine whose reader lags coalesces them), for a client that streams and one that reads
the answer whole (``stream: false``). Shapes: a 2,000- and a 20,000-token text answer (an agent
writing a long file); one call whose arguments are a 2,000-token file (an agent writing code);
text then two short calls. Process CPU per token, medians over repeats. Run it against two trees
side by side::

    for t in before after; do PYTHONPATH=/tmp/kvr-$t/operator \\
      .venv/bin/python benchmarks/output_parser_bench.py --out /tmp/parser_$t.json; done
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from kvretention.dataplane.protocol import PreprocessedRequest  # noqa: E402
from kvretention.dataplane.worker.output_parser import OutputParser  # noqa: E402
from kvretention.dataplane.worker.parsing import (  # noqa: E402
    ParserNames,
    plan_output,
)
from support.weather_tool import WEATHER  # noqa: E402

TOKEN_CHARS = 4
SPECIAL = re.compile(r"(<tool_call>|</tool_call>)")
WRITE = {
    "name": "write",
    "description": "Write a file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def shapes() -> dict[str, str]:
    code = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(300))[: 2_000 * 4]
    words = " ".join(f"word{i % 97}" for i in range(1_600))[: 2_000 * 4]
    return {
        "text_2000_tokens": words,
        "text_20000_tokens": (words + " ") * 10,
        "one_call_2000_token_arguments": _call("write", {"path": "a.py", "content": code}),
        "text_then_two_calls": "Let me check both cities. "
        + _call("get_weather", {"city": "Paris"})
        + "\n"
        + _call("get_weather", {"city": "Rome"}),
    }


def tokens(text: str) -> list[str]:
    """``text`` as engine tokens: special tokens whole, other text ~4 characters a token."""
    out: list[str] = []
    for part in SPECIAL.split(text):
        if SPECIAL.fullmatch(part):
            out.append(part)
        else:
            out += [part[i : i + TOKEN_CHARS] for i in range(0, len(part), TOKEN_CHARS)]
    return [t for t in out if t]


def cpu_us_per_token(text: str, per_chunk: int, repeats: int, *, stream: bool = True) -> float:
    request = PreprocessedRequest.model_validate(
        {
            "request_id": "r",
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [WEATHER, WRITE],
            "stream": stream,
        }
    )
    plan = plan_output(request, ParserNames(tool_call_parser="qwen25"))
    pieces = tokens(text)
    chunks = ["".join(pieces[i : i + per_chunk]) for i in range(0, len(pieces), per_chunk)]
    runs = []
    for _ in range(repeats):
        parser = OutputParser(plan)
        start = time.process_time()
        for chunk in chunks:
            parser.feed(chunk)
        parser.finish()
        runs.append((time.process_time() - start) * 1e6 / len(pieces))
    return round(statistics.median(runs), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [
        {
            "shape": name,
            "tokens": len(tokens(text)),
            "per_chunk": per_chunk,
            "stream": stream,
            "cpu_us_per_token": cpu_us_per_token(text, per_chunk, args.repeats, stream=stream),
        }
        for name, text in shapes().items()
        for stream in (True, False)
        for per_chunk in (1, 16)
    ]
    print("| shape | tokens | client | tokens per chunk | CPU µs per token |")
    print("|---|---:|---|---:|---:|")
    for row in rows:
        client = "streams" if row["stream"] else "reads whole"
        print(
            f"| {row['shape']} | {row['tokens']} | {client} | {row['per_chunk']} "
            f"| {row['cpu_us_per_token']} |"
        )
    if args.out:
        result = {"machine": platform.processor() or platform.machine(), "rows": rows}
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
