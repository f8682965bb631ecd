"""Pure builders: a KvRetentionDeployment spec in, Kubernetes objects out."""
