"""What the retention plugin's L3 half meets inside SGLang, faked for its unit tests: SGLang's
page-hash chain, a Mooncake master's ``/metrics``, the store's config file and the store."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

MASTER_CONFIG = {
    "master_server_address": "127.0.0.1:1",
    "kvretention": {"pin_budget_ratio": 0.5, "max_pin_ttl_ms": 3_600_000},
}
"""A Mooncake config with the retention budget (its metrics port added per test)."""


def fake_hash(tokens: Sequence[int], seed: str | None, page_size: int) -> list[str]:
    """A chain like SGLang's: each page's key depends on its tokens and the key before it."""
    keys, prior = [], seed or "root"
    for i in range(0, len(tokens) // page_size * page_size, page_size):
        prior = f"{abs(hash((prior, tuple(tokens[i : i + page_size])))):x}"
        keys.append(prior)
    return keys


def serve_master_metrics(bodies: list[bytes]) -> tuple[http.server.ThreadingHTTPServer, int]:
    """A master's /metrics whose body is the last of ``bodies`` (append one to restart it)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(bodies[-1])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def use_mooncake_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: dict[str, Any]
) -> Path:
    """Write ``config`` as the store's config file and point SGLang's variable at it."""
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", str(path))
    return path


def fake_store(*, segment_bytes: int = 16 * 1024 * 1024, tp_size: int = 1, **extra: Any) -> Any:
    """A MooncakeStore as the L3 hooks read it: its segment size and its parallel sizes."""
    return SimpleNamespace(
        config=SimpleNamespace(global_segment_size=segment_bytes),
        storage_config=SimpleNamespace(tp_size=tp_size, pp_size=1),
        **extra,
    )
