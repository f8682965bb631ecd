"""The one exception the local control plane raises for problems a user can fix."""


class ClusterError(Exception):
    """A missing binary, a taken port, a component that died or never became ready."""
