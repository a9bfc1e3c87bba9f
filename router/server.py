"""Builds the router from its flags and serves it."""

from __future__ import annotations

import argparse
import logging
import os
import socket

import uvicorn
from prometheus_client import CollectorRegistry

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.core.config import ModelConfig
from tandem.engine.telemetry.request_log import configure_logging
from tandem.engine.telemetry.tracing import Tracing
from tandem.engine.tokenizer import load_tokenizer
from tandem.router.app import Router, RouterOptions
from tandem.router.discovery import EndpointSliceDiscovery, StaticDiscovery
from tandem.router.metrics import RouterMetrics
from tandem.router.monitor import Discovery
from tandem.router.policy import POLICIES, TierCosts
from tandem.router.preprocess import ModelLimits, Preprocessor

logger = logging.getLogger(__name__)


def build_router(args: argparse.Namespace) -> Router:
    """Everything but the event loop; raises ValueError for inconsistent flags."""
    model = ModelConfig.from_pretrained(args.model)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    max_len = args.max_model_len or model.max_position_embeddings
    limits = ModelLimits(name, model.vocab_size, max_len, args.block_size, model.eos_token_ids)
    tokenizer = load_tokenizer(args.model)
    pre = Preprocessor(tokenizer, limits, args.tool_call_parser, args.reasoning_parser)
    pre.structured.grammars.prepare()  # not on the first structured request
    pod = os.environ.get("POD_NAME") or f"{socket.gethostname()}:{args.port}"
    options = RouterOptions(
        tuple(args.api_key),
        args.max_inflight,
        args.health_interval,
        args.max_attempts,
        args.health_timeout,
        args.worker_read_timeout,
        args.cpu_workers,
        DeploymentToken.from_env(),
        args.responses_store_size,
        TierCosts(args.kv_host_hit_cost, args.kv_disk_hit_cost),
    )
    metrics = RouterMetrics(CollectorRegistry(), name, pod)
    tracing = Tracing("tandem-router", args.otlp_traces_endpoint)
    return Router(pre, POLICIES[args.policy], _discovery(args), metrics, options, tracing)


def _discovery(args: argparse.Namespace) -> Discovery:
    if args.discovery == "kubernetes":
        if not args.selector:
            raise ValueError("--discovery kubernetes needs --selector")
        return EndpointSliceDiscovery(args.selector, args.namespace)
    if not args.decode:
        raise ValueError("static discovery needs at least one --decode URL")
    return StaticDiscovery(args.prefill, args.decode)


def run(args: argparse.Namespace) -> None:
    configure_logging(args.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per health check otherwise
    router = build_router(args)
    logger.info("router for %s, policy %s", router.pre.limits.name, args.policy)
    config = uvicorn.Config(
        router.app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        timeout_keep_alive=args.timeout_keep_alive,
    )  # fmt: skip
    try:
        uvicorn.Server(config).run()
    finally:
        router.tracing.shutdown()
