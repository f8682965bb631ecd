"""What the model reads, as processes: a worker whose engine has no multimodal processor refuses
images (SGLang would drop them), says so in ``/v1/info``, and Codex's catalog lists
``["text"]`` through the router and through a frontend that places itself; a multimodal one
keeps both."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from support.processes import KvrProcess, StartKvretention

PIXEL = "data:image/png;base64,iVBORw0KGgo="


@dataclass(frozen=True)
class Fleet:
    text_only: KvrProcess
    multimodal: KvrProcess
    frontends: dict[str, KvrProcess]


@pytest.fixture(scope="module")
def fleet(kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    d = tmp_path_factory.mktemp("modalities")
    instructions = d / "codex.md"
    instructions.write_text("You are a coding agent.\n")
    catalog = ["--model", "m", "--codex-instructions-file", str(instructions)]
    text_only = kvretention_process(
        ["worker", "--engine", "standin:flat"], env={"KVR_STANDIN_TEXT_ONLY": "1"}
    )
    multimodal = kvretention_process(["worker", "--engine", "standin:flat"])
    router = kvretention_process(["router", "--worker", text_only.base_url])
    frontends = {
        "router-text-only": ["--router-url", router.base_url],
        "placing-mixed": ["--worker", text_only.base_url, "--worker", multimodal.base_url],
        "placing-multimodal": ["--worker", multimodal.base_url],
    }
    return Fleet(
        text_only,
        multimodal,
        {
            name: kvretention_process(["frontend", *args, *catalog], ready_path="/readyz")
            for name, args in frontends.items()
        },
    )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@pytest.mark.parametrize(
    ("frontend", "modalities"),
    [
        ("router-text-only", ["text"]),
        ("placing-mixed", ["text"]),
        ("placing-multimodal", ["text", "image"]),
    ],
)
def test_codex_catalog_lists_what_every_worker_reads(
    fleet: Fleet, frontend: str, modalities: list[str]
) -> None:
    catalog = _get(fleet.frontends[frontend].base_url + "/v1/models?client_version=0.171.0")
    assert [m["input_modalities"] for m in catalog["models"]] == [modalities]
    assert "context_window" not in catalog["models"][0]  # the stand-in has no context length


def test_each_worker_says_what_its_model_reads(fleet: Fleet) -> None:
    assert _get(fleet.text_only.base_url + "/v1/info")["input_modalities"] == ["text"]
    assert _get(fleet.multimodal.base_url + "/v1/info")["input_modalities"] == ["text", "image"]


def _chat_with_image(base_url: str) -> tuple[int, dict[str, Any]]:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": PIXEL}},
    ]
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    request = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_an_image_is_refused_by_the_text_only_model_and_read_by_the_other(fleet: Fleet) -> None:
    status, body = _chat_with_image(fleet.frontends["router-text-only"].base_url)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert "image input is not supported" in body["error"]["message"]
    status, body = _chat_with_image(fleet.frontends["placing-multimodal"].base_url)
    assert status == 200, body
