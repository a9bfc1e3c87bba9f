"""What processes share on the network: the wire schema between router, decode and prefill, the
HTTP error body, the deployment token, KV events, the Kubernetes client configuration.
Light: no torch."""
