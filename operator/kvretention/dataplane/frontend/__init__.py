"""The user-facing frontend: OpenAI and Anthropic HTTP APIs in, ``PreprocessedRequest`` out.

Provider fields stop here: cache controls are validated and normalized into the KV-hint envelope
before anything is forwarded, and the router's NDJSON stream is turned back into each provider's
response and SSE format.
"""
