"""The worker process reads SGLang's own parser flags and tokenizer path from its engine argv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.chat_tokenizer import save
from support.processes import StartKvretention
from support.weather_tool import WEATHER
from support.worker_client import calls, post, wait_for


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tmp_path_factory.mktemp("tokenizer"))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_worker_parses_tool_calls_and_reasoning_with_the_configured_parsers(
    kvretention_process: StartKvretention, tokenizer_dir: Path, tmp_path: Path
) -> None:
    record = tmp_path / "calls.jsonl"
    # SGLang's flags pass through to the engine (the helper appends --host/--port, so no "--").
    proc = kvretention_process(
        [
            "worker",
            "--engine",
            "standin:versioned",
            "--model-path",
            str(tokenizer_dir),
            "--tool-call-parser",
            "qwen25",
            "--reasoning-parser",
            "qwen3",
        ],
        env={"KVR_STANDIN_RECORD": str(record)},
        timeout=90.0,
    )
    payload = {
        "request_id": "proc-tools",
        "model": "m",
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "[[standin:reasoning]] [[standin:tool_call]]"}],
        "kv_hints": {"retain_full_prompt": {"ttl_seconds": 60}},
    }
    status, lines = post(proc.base_url, json.dumps(payload).encode())
    assert status == 200
    assert "stand-in answer" in "".join(line.get("reasoning", "") for line in lines)
    deltas = [d for line in lines for d in line.get("tool_calls", [])]
    assert deltas[0]["name"] == "get_weather" and deltas[0]["id"].startswith("call_")
    arguments = "".join(d.get("arguments", "") for d in deltas)
    assert json.loads(arguments) == {"city": "stand-in"}
    assert lines[-1]["finish_reason"] == "tool_calls"
    (call,) = calls(record, "proc-tools")
    (directive,) = call["kwargs"]["kv_hints"]["actions"][0]["payload"]["directives"]
    assert (directive["start"], directive["end"]) == (0, len(call["kwargs"]["input_ids"]))
    assert directive["duration"] == 60
    assert isinstance(call["kwargs"]["input_ids"], list)


def test_an_unknown_parser_name_stops_the_worker_at_start(
    kvretention_process: StartKvretention,
) -> None:
    with pytest.raises(RuntimeError) as info:
        kvretention_process(
            ["worker", "--engine", "standin:flat", "--tool-call-parser", "qwen2.5"], timeout=90.0
        )
    log = str(info.value)
    assert "unknown --tool-call-parser 'qwen2.5'; SGLang knows:" in log
    assert "qwen25" in log
    assert "Traceback" not in log


def test_worker_resolves_breakpoints_and_traces_them(
    kvretention_process: StartKvretention, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A marked system part and a marked tool reach the engine as kv.retain ranges ending where
    those elements end in the rendered prompt; the trace says which element made which range."""
    record, trace = tmp_path / "calls.jsonl", tmp_path / "trace.jsonl"
    proc = kvretention_process(
        [
            *("worker", "--engine", "standin:versioned", "--trace-file", str(trace)),
            *("--model-path", str(tokenizer_dir)),
        ],
        env={"KVR_STANDIN_RECORD": str(record)},
        timeout=90.0,
    )
    system = [
        {"type": "text", "text": "Rules."},
        {"type": "text", "text": "Be terse.", "retain_ttl": 3600},
    ]
    payload = {
        "request_id": "proc-prefix",
        "model": "m",
        "tools": [{**WEATHER, "retain_ttl": 300}],
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "hello"},
        ],
        "kv_hints": {"retain_prefixes": {"breakpoints": 2}},
    }
    status, _ = post(proc.base_url, json.dumps(payload).encode())
    assert status == 200
    (call,) = calls(record, "proc-prefix")
    directives = call["kwargs"]["kv_hints"]["actions"][0]["payload"]["directives"]
    (entry,) = wait_for(lambda: [json.loads(line) for line in _lines(trace)])
    ends = {b["element"]: b["token_end"] for b in entry["breakpoints"]}
    assert set(ends) == {"tools[0]", "messages[0].content[1]"}
    # the template lists tools after the system text: the system part ends first
    assert ends["messages[0].content[1]"] < ends["tools[0]"] < len(call["kwargs"]["input_ids"])
    assert directives == [
        {"start": 0, "end": ends["messages[0].content[1]"], "priority": 50, "duration": 3600},
        {
            "start": ends["messages[0].content[1]"],
            "end": ends["tools[0]"],
            "priority": 50,
            "duration": 300,
        },
    ]
    assert entry["kv_hints"] == call["kwargs"]["kv_hints"]
