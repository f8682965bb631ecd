"""The control plane: kopf handlers, pure builders, status computation and the API client."""
