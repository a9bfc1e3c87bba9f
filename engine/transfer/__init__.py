"""The KV transfer between prefill and decode: ZMQ messages and the NIXL agent, KV-head and
rank maths for any TP sizes, staging, and the decode side's fail-over policy and holds."""
