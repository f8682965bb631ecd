"""The worker: serves the router's protocol and hands each request, and its KV hint, to SGLang."""
