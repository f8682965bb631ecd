"""The control plane: the watches, the planner and its pure builders, status computation, the
executor and the API client."""
