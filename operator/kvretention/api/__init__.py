"""The KvRetentionDeployment API: pydantic models that generate the CRD."""
