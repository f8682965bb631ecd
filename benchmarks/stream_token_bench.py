"""CPU per streamed token in the Python steps each token of an answer crosses, in-process.

An agent's answer streams token by token: engine -> worker -> (router) -> frontend -> client. Per
token, the worker turns SGLang's output into a ``GenerateChunk`` and writes its NDJSON line
(``StreamAdapter.chunk`` and the worker app's ``_line``); every hop's client frames the bytes it
reads (``HopResponse._feed``: HTTP chunked framing); the frontend reads the line back
(``upstream._parse_line``) and writes the client's SSE frame (Chat Completions, Messages and
Responses formatters). Text deltas as SGLang sends them (cumulative outputs, one token each) for
a 256- and a 2,000-token answer; no output parser (``output_parser_bench.py`` measures it).
Process CPU per token, the least of the repeats. Run it against two trees side by side::

    for t in before after; do PYTHONPATH=/tmp/kvr-$t/operator \\
      .venv/bin/python benchmarks/stream_token_bench.py --out /tmp/stream_token_$t.json; done
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.endpoints import CHAT, MESSAGES, RESPONSES, GenerateEndpoint
from kvretention.dataplane.frontend.upstream import _parse_line
from kvretention.dataplane.hop_client import HopClient, HopResponse, _Connection
from kvretention.dataplane.worker.app import _line
from kvretention.dataplane.worker.call import StreamAdapter

HERE = Path(__file__).resolve().parent
TOKEN = " tok"


def outputs(tokens: int) -> list[dict[str, Any]]:
    """SGLang's cumulative stream outputs of a ``tokens``-token text answer."""
    out: list[dict[str, Any]] = []
    text, ids = "", []
    for i in range(tokens):
        text += TOKEN
        ids = [*ids, 1000 + i]
        meta: dict[str, Any] = {"prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": i + 1}
        if i == tokens - 1:
            meta["finish_reason"] = {"type": "stop"}
        out.append({"text": text, "output_ids": ids, "meta_info": meta})
    return out


def per_token_us(step: Callable[[], int], *, repeats: int) -> float:
    """``step()`` handles a whole answer and returns its token count: CPU µs per token."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        tokens = step()
        best = min(best, (time.process_time() - start) / tokens * 1e6)
    return best


def worker_step(answer: list[dict[str, Any]]) -> Callable[[], int]:
    def step() -> int:
        adapter = StreamAdapter()
        for output in answer:
            _line(adapter.chunk(output))
        return len(answer)

    return step


def lines_of(answer: list[dict[str, Any]]) -> list[bytes]:
    adapter = StreamAdapter()
    return [_line(adapter.chunk(output)) for output in answer]


def hop_step(lines: list[bytes]) -> Callable[[], int]:
    frames = [b"%x\r\n%s\r\n" % (len(line), line) for line in lines]

    def step() -> int:
        conn = _Connection(("peer", 1, False), set())
        resp = HopResponse(HopClient(connect_timeout=1.0, read_timeout=1.0), conn, read_timeout=1.0)
        conn.answer = resp
        resp._feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for frame in frames:
            resp._feed(frame)
            resp._body.clear()
        return len(frames)

    return step


def frontend_step(
    lines: list[bytes], api: GenerateEndpoint, body: dict[str, Any]
) -> Callable[[], int]:
    config = FrontendConfig(router_url="http://router")
    parsed = api.parse(body, hints=True, breakpoints=config.breakpoints, resumer=None)

    def step() -> int:
        formatter = api.formatter(parsed, request_id="bench")
        formatter.start()
        for line in lines:
            formatter.chunk(_parse_line(line.rstrip(b"\n"), hint_param=None))
        formatter.finish()
        return len(lines)

    return step


BODIES: dict[str, tuple[GenerateEndpoint, dict[str, Any]]] = {
    "chat": (CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    "messages": (
        MESSAGES,
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
    ),
    "responses": (RESPONSES, {"model": "m", "input": "hi", "stream": True}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "stream_token.json")
    args = parser.parse_args()
    rows: dict[str, dict[str, float]] = {}
    for tokens in (256, 2000):
        answer = outputs(tokens)
        lines = lines_of(answer)
        row = {
            "worker": per_token_us(worker_step(answer), repeats=args.repeats),
            "hop read": per_token_us(hop_step(lines), repeats=args.repeats),
        }
        for name, (api, body) in BODIES.items():
            row[f"frontend {name}"] = per_token_us(
                frontend_step(lines, api, body), repeats=args.repeats
            )
        rows[f"{tokens} tokens"] = row
        print(f"{tokens:>5} tokens  " + "  ".join(f"{k} {v:6.2f} µs" for k, v in row.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
