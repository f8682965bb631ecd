"""The request path: frontend, router, worker and the protocol between them."""
