"""The worker's KV event subscription: the SGLang flag it adds, and a real ZMQ PUB feeding it."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest

from kvretention.dataplane.worker.kv_events import BlockRemoved, BlockStored, KVEventBatch
from kvretention.dataplane.worker.kv_feed import (
    KV_EVENTS_FLAG,
    ResidencyFeed,
    kv_events_argv,
)
from kvretention.ports import free_port


def test_argv_binds_sglang_publisher_on_loopback() -> None:
    argv, endpoint = kv_events_argv(["--model-path", "m"], port=5999)
    assert endpoint == "tcp://127.0.0.1:5999"
    assert argv[:2] == ["--model-path", "m"]
    assert argv[2] == KV_EVENTS_FLAG
    assert json.loads(argv[3]) == {
        "publisher": "zmq",
        "endpoint": endpoint,
        "bind": True,
        "topic": "kv",
    }


@pytest.mark.parametrize("given", [[KV_EVENTS_FLAG, "{}"], [f"{KV_EVENTS_FLAG}={{}}"]])
def test_argv_refuses_a_config_of_the_users(given: list[str]) -> None:
    with pytest.raises(ValueError, match="--kv-events-config"):
        kv_events_argv(["--model-path", "m", *given], port=5999)


def test_feed_indexes_what_a_publisher_sends() -> None:
    zmq: Any = pytest.importorskip("zmq")
    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    feed = ResidencyFeed(f"tcp://127.0.0.1:{port}")
    feed.start()
    encoder = msgspec.msgpack.Encoder()
    stored = BlockStored(
        block_hashes=[1, 2, 3],
        parent_block_hash=None,
        token_ids=list(range(10)),
        block_size=4,
        lora_id=None,
        medium="GPU",
        cache_salt="kvr-tenant:acme",
    )
    batches = [
        (0, KVEventBatch(ts=1.0, events=[stored])),
        (1, KVEventBatch(ts=2.0, events=[BlockRemoved(block_hashes=[3], medium="GPU")])),
    ]
    try:
        deadline = time.monotonic() + 10
        summary: dict[str, Any] = feed.summary()
        # A SUB socket drops what is published before it joined: resend until it has seen both.
        while summary["seq"] != 1 and time.monotonic() < deadline:
            for seq, batch in batches:
                pub.send_multipart([b"kv", seq.to_bytes(8, "big"), encoder.encode(batch)])
            pub.send_multipart([b"other-topic", b"\0" * 8, b"ignored"])
            time.sleep(0.05)
            summary = feed.summary()
    finally:
        feed.stop()
        pub.close(linger=0)
    assert summary["entries"] == [
        {"cache_salt": "kvr-tenant:acme", "session_id": None, "blocks": 2, "tokens": 8}
    ]
    assert summary["malformed"] == 0
    assert summary["idle_s"] is not None
