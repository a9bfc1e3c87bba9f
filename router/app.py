"""The router's FastAPI app: OpenAI's `/v1/completions`, `/v1/chat/completions`,
`/v1/responses` (`tandem.router.responses_api`) and `/v1/models`, vLLM's `/tokenize` and
`/detokenize`, and `/health`, `/metrics`, `/workers`.

Order of checks for a generation request: API key (401), body and its sampling parameters
(400), model name (404), saturation (429 with Retry-After), then the prompt (400) and the
workers (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.http import KEEP_ALIVE_S as NODE_KEEP_ALIVE_S
from tandem.engine.api.http import add_http_error_handler, add_validation_handler
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.engine.telemetry.tracing import Tracing
from tandem.router.anthropic_protocol import MessagesInput, MessagesRequest
from tandem.router.cpu_pool import DEFAULT_WORKERS, CpuPool
from tandem.router.dispatch import READ_TIMEOUT_S, Dispatcher, Job
from tandem.router.errors import APIError, ModelNotFound, Unauthorized, shaped_for
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.http_pool import ClientShards
from tandem.router.kv_index import PrefixIndex
from tandem.router.messages import MessagesAPI, add_anthropic_error_shapes
from tandem.router.metrics import RouterMetrics
from tandem.router.middleware import AuthAndCount
from tandem.router.monitor import Discovery, WorkerMonitor
from tandem.router.policy import DEFAULT_TIER_COSTS, Policy, TierCosts
from tandem.router.preprocess import Preprocessor, Prompt, prompt_items
from tandem.router.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tandem.router.response_store import DEFAULT_SIZE as DEFAULT_STORE_SIZE
from tandem.router.response_store import ResponseStore
from tandem.router.responses import ChatFormat, CompletionFormat, Format
from tandem.router.responses_api import RESPONSES_NAMES, ResponsesAPI
from tandem.router.responses_protocol import ResponsesRequest
from tandem.router.workers import WorkerPool

# Seconds an idle connection to a node stays in the pool: less than the node keeps it.
WORKER_KEEPALIVE_S = NODE_KEEP_ALIVE_S - 15.0


@dataclass(frozen=True)
class RouterOptions:
    api_keys: tuple[str, ...] = ()
    max_inflight: int = 256  # choices (prompts x n) in progress before 429
    health_interval_s: float = 1.0
    max_attempts: int = 3  # decode workers tried per choice
    health_timeout_s: float = 5.0
    read_timeout_s: float = READ_TIMEOUT_S  # between two records of a decode stream
    cpu_workers: int = DEFAULT_WORKERS  # threads preprocessing requests off the event loop
    # what the nodes' control ports ask of the router (`Authorization`, on every call)
    token: DeploymentToken = field(default_factory=DeploymentToken)
    responses_store_size: int = DEFAULT_STORE_SIZE  # Responses API responses kept
    tier_costs: TierCosts = DEFAULT_TIER_COSTS  # what kv-aware counts a lower-tier prefix hit

    def __post_init__(self) -> None:
        if self.cpu_workers < 1:
            raise ValueError(f"--cpu-workers must be at least 1, not {self.cpu_workers}")


class Router:
    """Owns the pool, the index, the HTTP client, the monitor and the CPU pool (every
    use of the tokenizer and the grammar compiler runs there, off the event loop); `app`
    serves them."""

    def __init__(
        self,
        pre: Preprocessor,
        policy: Policy,
        discovery: Discovery,
        metrics: RouterMetrics,
        options: RouterOptions,
        tracing: Tracing | None = None,
    ) -> None:
        self.pre = pre
        self.tracing = tracing or Tracing.off()
        self.policy = policy
        self.discovery = discovery
        self.metrics = metrics
        self.options = options
        self.pool = WorkerPool()
        self.index = PrefixIndex()
        self.responses = ResponsesAPI(pre, ResponseStore(options.responses_store_size))
        self.app = FastAPI(title="Tandem router", lifespan=self._lifespan)
        self.app.add_middleware(AuthAndCount, router=self)
        add_validation_handler(self.app)
        add_http_error_handler(self.app)
        add_anthropic_error_shapes(self.app)
        self.messages = MessagesAPI(self)
        self._add_routes()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # A connect timeout counts as the worker failing: it must exceed the time this
        # process's own event loop can lag on a busy machine (local dead ports are refused).
        timeout = httpx.Timeout(connect=5.0, read=None, write=10.0, pool=None)

        def client(limits: httpx.Limits) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                limits=limits, timeout=timeout, headers=self.options.token.headers()
            )

        # Idle connections are dropped well before a node's server closes them
        # (`tandem.engine.api.http.KEEP_ALIVE_S`), so a request never goes out on a connection the
        # server is closing; and kept across the pauses of bursty traffic, so a burst does
        # not wait for new connections to the decode nodes.
        self.cpu = CpuPool(self.options.cpu_workers)
        async with ClientShards(client, keepalive_s=WORKER_KEEPALIVE_S) as http:
            self.dispatcher = Dispatcher(
                self.pool, self.index, self.policy, http, self.metrics,
                self.pre.limits.block_size, self.options.max_attempts,
                self.options.read_timeout_s, self.options.tier_costs,
            )  # fmt: skip
            self.runner = GenerationRunner(
                self.dispatcher, self.metrics, self.options.max_inflight, self.cpu, self.tracing
            )
            self.monitor = WorkerMonitor(
                self.pool, self.index, self.discovery, http, self.options.health_interval_s,
                self.metrics, self.options.health_timeout_s,
            )  # fmt: skip
            task = asyncio.create_task(self.monitor.run())
            try:
                yield
            finally:
                task.cancel()
                self.monitor.close()
                self.cpu.close()

    # -- checks ---------------------------------------------------------------------------

    def authorize(self, header: str, api_key: str = "") -> None:
        """Raise Unauthorized unless keys are off, or the `Authorization` header bears one
        of them, or (Anthropic's way) the `x-api-key` header is one."""
        if not self.options.api_keys:
            return
        key = header[7:] if header.lower().startswith("bearer ") else api_key
        if not any(secrets.compare_digest(key, k) for k in self.options.api_keys):
            raise Unauthorized(
                "a valid API key is required (Authorization: Bearer <key>, or x-api-key)"
            )

    def check_model(self, model: str | None) -> None:
        """Raise ModelNotFound unless `model` is None or the served model."""
        if model is not None and model != self.pre.limits.name:
            raise ModelNotFound(f"The model `{model}` does not exist.", "model")

    # -- generation -----------------------------------------------------------------------

    def _chat_params(self, req: ChatCompletionRequest) -> SamplingParams:
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError("top_logprobs needs logprobs set to true", "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        max_tokens = req.max_tokens
        if req.max_completion_tokens is not None:
            max_tokens = req.max_completion_tokens
        return self.pre.sampling_params(req, max_tokens, logprobs, _chat_names(req))

    def _completion(
        self, req: CompletionRequest, params: SamplingParams, base_id: str
    ) -> Generation:
        if req.suffix:
            raise APIError("suffix is not supported", "suffix")
        if req.best_of not in (None, req.n):
            raise APIError("best_of must equal n when given", "best_of")
        if req.echo and req.logprobs is not None:
            raise APIError("echo with logprobs needs prompt logprobs, not supported", "echo")
        prompts = self.pre.completion_prompts(req)
        spec = self.pre.structured.spec(req)
        response_id = f"cmpl-{base_id}"
        jobs = self._jobs(response_id, req, params, prompts, spec)
        echoes = None
        if req.echo:
            texts = [
                p.text if p.text is not None else self.pre.detokenize(p.token_ids) for p in prompts
            ]
            echoes = [text for text in texts for _ in range(req.n)]
        fmt = CompletionFormat(self.pre, req.logprobs is not None)
        return self._generation(response_id, req, fmt, jobs, prompts, echoes)

    def _chat(
        self,
        req: ChatCompletionRequest,
        params: SamplingParams,
        base_id: str,
        response_id: str | None = None,
        api_names: Mapping[str, str] | None = None,
    ) -> Generation:
        """The chat generation; `response_id` (default `chatcmpl-<base_id>`) and
        `api_names` (the fields' names in errors) for the APIs that ride on chat."""
        tool_use = self.pre.structured.tool_use(req)
        prompt = self.pre.chat_prompt(req, tool_use)
        spec = self.pre.structured.spec(req, tool_use)
        reasoning = self.pre.reasoning_for(prompt)
        if reasoning is not None and spec is not None:  # the grammar applies to the answer
            spec = self.pre.structured.after_reasoning(spec)
        parser = tool_use.parser if tool_use is not None else None
        response_id = response_id or f"chatcmpl-{base_id}"
        keep = parser is not None and parser.keeps_special_tokens
        names = _chat_names(req) if api_names is None else api_names
        jobs = self._jobs(response_id, req, params, [prompt], spec, keep, names)
        fmt = ChatFormat(self.pre, req.logprobs, parser, reasoning)
        return self._generation(response_id, req, fmt, jobs, [prompt])

    def _jobs(
        self,
        response_id: str,
        req: CompletionRequest | ChatCompletionRequest,
        params: SamplingParams,
        prompts: list[Prompt],
        spec: StructuredOutputsParams | None = None,
        keep_special_tokens: bool = False,
        api_names: Mapping[str, str] = MappingProxyType({}),
    ) -> list[Job]:
        """One job per choice, request ids `<response id>-<choice index>`."""
        jobs = []
        for p_index, prompt in enumerate(prompts):
            choices = self.pre.sampling(params, prompt, spec, keep_special_tokens, api_names)
            for c_index, sampling in enumerate(choices):
                rid = f"{response_id}-{p_index * req.n + c_index}"
                jobs.append(Job(rid, prompt, sampling, req.cache_salt))
        return jobs

    def _generation(
        self,
        response_id: str,
        req: CompletionRequest | ChatCompletionRequest,
        fmt: Format,
        jobs: list[Job],
        prompts: list[Prompt],
        echoes: list[str] | None = None,
    ) -> Generation:
        num_prompt = sum(len(p.token_ids) for p in prompts)
        echoes = echoes or [""] * len(jobs)
        name = self.pre.limits.name
        return Generation(response_id, name, fmt, jobs, echoes, num_prompt, req.include_usage)

    async def respond_chat(
        self,
        req: ChatCompletionRequest,
        http: Request,
        on_built: Callable[[Generation], None] = lambda gen: None,
    ) -> Response:
        """The chat endpoint's answer (`on_built` sees the generation once it is built).
        Raises APIError."""
        params = self._chat_params(req)
        self.check_model(req.model)
        base = _base_id(http)

        def build() -> Generation:
            gen = self._chat(req, params, base)
            on_built(gen)
            return gen

        return await self.runner.respond(build, req.stream, http, req.n)

    # -- routes ---------------------------------------------------------------------------

    def _add_routes(self) -> None:
        app = self.app

        @app.exception_handler(APIError)
        async def api_error(request: Request, exc: APIError) -> Response:
            return shaped_for(request.url.path, exc)

        @app.post("/v1/completions")
        async def completions(req: CompletionRequest, request: Request) -> Response:
            params = self.pre.sampling_params(req, req.max_tokens, req.logprobs)
            self.check_model(req.model)
            base = _base_id(request)
            num_choices = len(prompt_items(req)) * req.n
            return await self.runner.respond(
                lambda: self._completion(req, params, base), req.stream, request, num_choices
            )

        @app.post("/v1/chat/completions")
        async def chat(req: ChatCompletionRequest, request: Request) -> Response:
            return await self.respond_chat(req, request)

        @app.post("/v1/messages")
        async def messages(req: MessagesRequest, request: Request) -> Response:
            return await self.messages.respond(req, request)

        @app.post("/v1/messages/count_tokens")
        async def count_tokens(req: MessagesInput) -> Response:
            return await self.messages.count_tokens(req)

        @app.post("/v1/responses")
        async def create_response(req: ResponsesRequest, request: Request) -> Response:
            response_id = f"resp_{_base_id(request)}"
            turn = self.responses.turn(req, response_id)
            chat = turn.chat
            params = self.pre.sampling_params(
                chat, chat.max_completion_tokens, None, RESPONSES_NAMES
            )
            self.check_model(req.model)
            return await self.runner.respond(
                lambda: self._chat(chat, params, "", response_id, RESPONSES_NAMES),
                req.stream, request, 1, self.responses.writer(turn),
            )  # fmt: skip

        @app.get("/v1/responses/{response_id}")
        async def retrieve_response(response_id: str) -> Response:
            return JSONResponse(self.responses.retrieve(response_id))

        @app.delete("/v1/responses/{response_id}")
        async def delete_response(response_id: str) -> Response:
            return JSONResponse(self.responses.delete(response_id))

        @app.get("/v1/models")
        async def models() -> Response:
            limits = self.pre.limits
            card = {
                "id": limits.name, "object": "model", "created": int(time.time()),
                "owned_by": "tandem", "root": limits.name, "max_model_len": limits.max_model_len,
            }  # fmt: skip
            return JSONResponse({"object": "list", "data": [card]})

        @app.post("/tokenize")
        async def tokenize(req: TokenizeRequest) -> Response:
            self.check_model(req.model)
            if (req.prompt is None) == (req.messages is None):
                raise APIError("give exactly one of prompt and messages", "prompt")
            if req.messages is not None:
                tools = [t.model_dump(exclude_none=True) for t in req.tools or []] or None
                ids = await self.cpu.run(
                    self.pre.encode_messages, req.messages, req.add_generation_prompt, None,
                    tools, self.pre.template_kwargs(req),
                )  # fmt: skip
            else:
                ids = await self.cpu.run(self.pre.tokenize, req.prompt, req.add_special_tokens)
            limits = self.pre.limits
            return JSONResponse(
                {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids}
            )

        @app.post("/detokenize")
        async def detokenize(req: DetokenizeRequest) -> Response:
            self.check_model(req.model)
            return JSONResponse({"prompt": await self.cpu.run(self.pre.detokenize, req.tokens)})

        @app.get("/health")
        async def health() -> Response:
            healthy = [w for w in self.pool.workers.values() if w.healthy]
            ok = any(w.address.role == "decode" for w in healthy)
            body = {"status": "ok" if ok else "no decode worker", "workers": len(healthy)}
            return JSONResponse(body, status_code=200 if ok or self.pool.served else 503)

        @app.get("/workers")
        async def workers() -> Response:
            return JSONResponse([w.describe() for w in self.pool.workers.values()])

        @app.get("/metrics")
        async def metrics() -> Response:
            self.metrics.observe_workers(self.pool.workers.values())
            return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _base_id(request: Request) -> str:
    """What a response id is made of: the request id the router made, or, when the client
    named one (which it may reuse), a fresh one: ids must be unique downstream."""
    state = request.state
    return uuid.uuid4().hex if state.client_request_id else state.request_id


# The chat API's names of engine fields, where they differ.
_CHAT_NAMES = MappingProxyType({"logprobs": "top_logprobs"})
_CHAT_NAMES_MAX_COMPLETION = MappingProxyType(
    {"logprobs": "top_logprobs", "max_tokens": "max_completion_tokens"}
)


def _chat_names(req: ChatCompletionRequest) -> Mapping[str, str]:
    """`top_logprobs` for the engine's `logprobs`; `max_completion_tokens` for `max_tokens`
    when the request set its length that way."""
    if req.max_completion_tokens is not None:
        return _CHAT_NAMES_MAX_COMPLETION
    return _CHAT_NAMES
