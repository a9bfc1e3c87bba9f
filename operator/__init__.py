"""kopf operator for the LLMDeployment custom resource (arrives with issue 5)."""
