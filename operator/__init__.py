"""The Kubernetes operator: LLMDeployment -> router, prefill and decode pools.

`render(llmd)` (pure) lives in `tandem.operator.render`; `tandem operator` runs the
reconcile under kopf.
"""
