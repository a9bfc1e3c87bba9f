"""Facts the design fixes (../shared/design.md), checked by tests of several components."""

# §7: the metric names every node exports (vLLM's, with the `tandem_` prefix).
DESIGN_METRICS = (
    "tandem_time_to_first_token_seconds",
    "tandem_inter_token_latency_seconds",
    "tandem_e2e_request_latency_seconds",
    "tandem_request_queue_time_seconds",
    "tandem_num_requests_running",
    "tandem_num_requests_waiting",
    "tandem_kv_cache_usage_ratio",
    "tandem_prefix_cache_queries_total",
    "tandem_prefix_cache_hits_total",
    "tandem_prompt_tokens_total",
    "tandem_generation_tokens_total",
    "tandem_num_preemptions_total",
    "tandem_kv_transfer_seconds",
    "tandem_kv_transfer_bytes_total",
    "tandem_kv_transfer_blocks_total",
    "tandem_kv_transfer_failures_total",
    "tandem_disagg_decisions_total",
    "tandem_prefill_fallbacks_total",
)
