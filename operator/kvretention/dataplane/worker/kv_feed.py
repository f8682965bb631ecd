"""The worker's subscription to its engine's KV events (``kvretention worker --kv-events``).

The worker asks SGLang to publish KV events on a free loopback port (:func:`kv_events_argv`), and a
thread here subscribes with a ZMQ SUB socket, decodes each batch and feeds the residency index
(:mod:`kvretention.dataplane.worker.kv_events`). ``GET /kv/residency`` serves its summary. pyzmq is
imported only when the feed starts: the stand-in engine never needs it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Final

import msgspec

from kvretention.dataplane.worker.kv_events import ResidencyIndex, decode_batch, decode_seq

log = logging.getLogger(__name__)

KV_EVENTS_FLAG: Final = "--kv-events-config"
TOPIC: Final = "kv"
_POLL_MS: Final = 200


def kv_events_argv(server_argv: Sequence[str], *, port: int) -> tuple[list[str], str]:
    """``server_argv`` with SGLang's ZMQ publisher bound to ``127.0.0.1:port``, and the endpoint to
    subscribe to. A ``--kv-events-config`` the user gave is refused: the worker must know where it
    publishes."""
    if any(a == KV_EVENTS_FLAG or a.startswith(f"{KV_EVENTS_FLAG}=") for a in server_argv):
        raise ValueError(f"--kv-events chooses SGLang's {KV_EVENTS_FLAG} itself: drop the flag")
    endpoint = f"tcp://127.0.0.1:{port}"
    config = {"publisher": "zmq", "endpoint": endpoint, "bind": True, "topic": TOPIC}
    return [*server_argv, KV_EVENTS_FLAG, json.dumps(config)], endpoint


class ResidencyFeed:
    """A SUB socket on the engine's publisher, on its own thread, feeding one index."""

    def __init__(self, endpoint: str, *, topic: str = TOPIC) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self._index = ResidencyIndex()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_applied: float | None = None
        self.malformed = 0

    def start(self) -> None:
        """Subscribe before the engine starts publishing (a SUB socket connects to a port nothing
        binds yet and waits), so no early batch is lost."""
        import zmq

        context: Any = zmq.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        self._thread = threading.Thread(
            target=self._run, args=(sub,), name="kv-events", daemon=True
        )
        self._thread.start()

    def _run(self, sub: Any) -> None:
        try:
            while not self._stop.is_set():
                if not sub.poll(_POLL_MS):
                    continue
                frames = sub.recv_multipart()
                self._receive(frames)
        finally:
            sub.close(linger=0)

    def _receive(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 3:
            self.malformed += 1
            return
        _, seq, payload = frames
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError:
            self.malformed += 1
            log.warning("undecodable KV event batch from %s", self.endpoint)
            return
        with self._lock:
            self._index.apply(decode_seq(seq), batch)
            self._last_applied = time.monotonic()

    def note_prompt(self, *, salt: str | None, session: str, ids: Sequence[int]) -> None:
        """A prompt about to reach the engine: the blocks it stores are this session's."""
        with self._lock:
            self._index.prompts.note(salt=salt, session=session, ids=ids)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * _POLL_MS / 1000)

    def summary(self) -> dict[str, Any]:
        """What ``GET /kv/residency`` serves: per salt and session, resident blocks and tokens;
        ``seq`` and ``idle_s`` (seconds since the last batch) say how current it is."""
        with self._lock:
            summary = self._index.summary()
            last = self._last_applied
        body = asdict(summary)
        body["entries"] = [asdict(e) for e in summary.entries]
        body["idle_s"] = None if last is None else round(time.monotonic() - last, 3)
        body["malformed"] = self.malformed
        return body
