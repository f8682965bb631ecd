"""``POST /v1/responses/compact``, Codex's opt-in remote compaction, and why this server refuses it.

OpenAI's endpoint answers the conversation's replacement history, whose heart is an opaque
``compaction`` item (``encrypted_content``) that only the server that wrote it can expand on the
next turns. The fleet stores nothing between requests, and a summary it invented would be neither
OpenAI's nor Codex's. Codex compacts by itself when its provider does not offer remote compaction:
it asks ``/v1/responses`` with its own compaction prompt and keeps the summary client-side, which
this server serves like any turn. So the endpoint is a deterministic 501 in OpenAI's error shape
(with ``x-should-retry: false``), never a 404 page.
"""

from __future__ import annotations

from typing import Final

from kvretention.dataplane.frontend.errors import FrontendError

PATH: Final = "/v1/responses/compact"
ENDPOINT: Final = "responses.compact"
"""The metrics and trace label."""


def compaction_unsupported() -> FrontendError:
    return FrontendError(
        status=501,
        code="unsupported_endpoint",
        message=(
            "Remote compaction (POST /v1/responses/compact) is not available on this server: it "
            "keeps no conversation state to expand a compaction item from. Leave remote "
            "compaction off for this provider; Codex then compacts through /v1/responses."
        ),
    )
