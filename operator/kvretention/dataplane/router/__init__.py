"""The router: picks workers (sticky sessions, least outstanding, prefill/decode pairs) and streams back."""
