"""The scheduling core: engine configuration, sampling parameters, request state, block pool
and prefix cache, KV-cache manager, scheduler. No model, no network."""
