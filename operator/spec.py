"""The LLMDeployment spec, read once into frozen dataclasses with the CRD's defaults.

The API server applies the CRD's defaults and rejects what its schema forbids; this reader
applies the same defaults and checks again, so `render()` behaves the same on a resource
the server never saw (a file, a test) and names the field of anything it refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.operator.kv_tiers import KVTiers, read_kv_tiers
from tandem.operator.pod_overrides import PodOverrides, read_pod_overrides
from tandem.operator.quantity import QUANTITY
from tandem.operator.reader import Reader
from tandem.operator.scaling import Scaling, read_scaling
from tandem.operator.slo import PoolBounds, SLOSpec, read_slo

DEFAULT_IMAGE = "ghcr.io/tandem-serving/tandem:0.1.0"
ROLES = ("router", "prefill", "decode")
POLICIES = ("round-robin", "least-load", "prefix-aware", "kv-aware")
# `tandem router --tool-call-parser` (tandem.router.cli.TOOL_PARSER_CHOICES; a test holds them
# equal: the operator imports nothing of the router)
TOOL_CALL_PARSERS = ("auto", "none", "hermes", "llama3_json", "mistral")
DTYPES = ("auto", "bfloat16", "float16", "float32")
SOURCES = ("pvc", "hostPath", "huggingFace")
# The download Job writes the cache: its claim needs a writable mode.
ACCESS_MODES = ("ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce")
WRITABLE_MODES = ("ReadWriteMany", "ReadWriteOnce")


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class ModelSource:
    """Exactly one source: `kind` is "pvc", "hostPath" or "huggingFace"."""

    kind: str
    claim_name: str = ""
    path: str = ""
    repo: str = ""
    revision: str = ""
    token: SecretKeyRef | None = None


@dataclass(frozen=True)
class ModelCache:
    """A claim a Job downloads a Hugging Face model into once, mounted read-only by every
    pod: an existing claim (`existing_claim`), or one the operator creates and owns."""

    existing_claim: str = ""
    size: str = ""
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: ModelSource
    dtype: str
    max_model_len: int | None
    cache: ModelCache | None = None


@dataclass(frozen=True)
class EngineSpec:
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool


@dataclass(frozen=True)
class RoleSpec:
    """One pool of pods: the router, prefill or decode (only these two have KV tiers)."""

    role: str
    replicas: int
    tensor_parallel_size: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    env: list[dict[str, Any]] = field(default_factory=list)
    scaling: Scaling | None = None
    pod: PodOverrides = field(default_factory=PodOverrides)
    kv_tiers: KVTiers = field(default_factory=KVTiers)


@dataclass(frozen=True)
class RouterSpec:
    pool: RoleSpec
    policy: str
    tool_call_parser: str
    service_type: str
    service_port: int
    api_key: SecretKeyRef | None


@dataclass(frozen=True)
class PodMonitorSpec:
    interval: str
    labels: dict[str, str]
    scraper_namespace: str


@dataclass(frozen=True)
class LLMDeploymentSpec:
    name: str
    namespace: str
    uid: str
    model: ModelSpec
    image: str
    engine: EngineSpec
    router: RouterSpec
    prefill: RoleSpec
    decode: RoleSpec
    remote_prefill_threshold: int
    on_prefill_failure: str
    pod_monitor: PodMonitorSpec | None
    slo: SLOSpec | None = None

    def pool(self, role: str) -> RoleSpec:
        return {"router": self.router.pool, "prefill": self.prefill, "decode": self.decode}[role]

    def planned(self, role: str) -> PoolBounds | None:
        """The SLO planner's bounds of `role`'s pool; None where the planner does not size
        it (no `spec.slo`, the router, or a pool `spec.slo` leaves out)."""
        return self.slo.bounds(role) if self.slo is not None else None

    def relaxed(self) -> tuple[str, ...]:
        """What each role's securityOverrides relax ("decode: privileged, runAsRoot")."""
        return tuple(
            f"{role}: {', '.join(flags)}"
            for role in ROLES
            if (flags := self.pool(role).pod.security.relaxed())
        )


def parse(llmd: dict[str, Any]) -> LLMDeploymentSpec:
    """Read an LLMDeployment object. Raises ValueError naming the first invalid field."""
    meta = Reader(llmd, "").child("metadata")
    spec = Reader(llmd, "").child("spec", required=True)
    name = meta.string("name", required=True, pattern=r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
    scaling = spec.child("autoscaling")
    parsed = LLMDeploymentSpec(
        name=name,
        namespace=meta.string("namespace", default="default"),
        uid=meta.string("uid", default=""),
        model=_model(spec.child("model", required=True)),
        image=spec.string("image", default=DEFAULT_IMAGE, min_length=1),
        engine=_engine(spec.child("engine")),
        router=_router(spec.child("router"), scaling),
        prefill=_pool(spec.child("prefill"), "prefill", 0, scaling),
        decode=_pool(spec.child("decode"), "decode", 1, scaling),
        remote_prefill_threshold=spec.child("disaggregation").integer(
            "remotePrefillThreshold", default=0, minimum=0
        ),
        on_prefill_failure=spec.child("disaggregation").string(
            "onPrefillFailure", default="recompute", choices=("recompute", "fail")
        ),
        pod_monitor=_pod_monitor(spec.child("monitoring").child("podMonitor")),
        slo=read_slo(spec),
    )
    return parsed


def _model(model: Reader) -> ModelSpec:
    source = _source(model.child("source", required=True))
    return ModelSpec(
        name=model.string("name", required=True, min_length=1),
        source=source,
        dtype=model.string("dtype", default="auto", choices=DTYPES),
        max_model_len=model.integer("maxModelLen", default=None, minimum=1),
        cache=_cache(model.child("cache"), source) if model.has("cache") else None,
    )


def _cache(cache: Reader, source: ModelSource) -> ModelCache:
    if source.kind != "huggingFace":
        raise cache.error("only a huggingFace source is downloaded into a cache")
    if ".." in f"{source.repo}/{source.revision}".split("/"):
        raise cache.error("the repo and revision name a folder of the claim: no '..' in them")
    present = [key for key in ("pvc", "existingClaim") if cache.has(key)]
    if len(present) != 1:
        raise cache.error(f"exactly one of pvc, existingClaim must be set, got {present}")
    if cache.has("existingClaim"):
        return ModelCache(existing_claim=cache.string("existingClaim", min_length=1))
    pvc = cache.child("pvc")
    modes = pvc.sequence("accessModes") if pvc.has("accessModes") else ["ReadWriteMany"]
    for index, mode in enumerate(modes):
        if mode not in ACCESS_MODES:
            raise pvc.error(f"must be one of {', '.join(ACCESS_MODES)}, got {mode!r}",
                            f"accessModes[{index}]")  # fmt: skip
    if not set(modes) & set(WRITABLE_MODES):
        raise pvc.error("the download Job writes the claim: include ReadWriteMany or "
                        "ReadWriteOnce", "accessModes")  # fmt: skip
    return ModelCache(
        size=pvc.string("size", required=True, pattern=QUANTITY),
        storage_class_name=pvc.string("storageClassName", default=None),
        access_modes=tuple(dict.fromkeys(modes)),
    )


def _source(source: Reader) -> ModelSource:
    present = [kind for kind in SOURCES if source.has(kind)]
    if len(present) != 1:
        raise source.error(f"exactly one of {', '.join(SOURCES)} must be set, got {present}")
    kind = present[0]
    body = source.child(kind)
    if kind == "pvc":
        return ModelSource(
            kind, claim_name=body.string("claimName", required=True, min_length=1),
            path=body.string("path", default=""),
        )  # fmt: skip
    if kind == "hostPath":
        return ModelSource(kind, path=body.string("path", required=True, pattern=r"/.*"))
    token = _secret_ref(body, "tokenSecretRef")
    return ModelSource(
        kind, repo=body.string("repo", required=True, min_length=1),
        revision=body.string("revision", default="main", min_length=1), token=token,
    )  # fmt: skip


def _engine(engine: Reader) -> EngineSpec:
    return EngineSpec(
        block_size=engine.integer("blockSize", default=16, choices=(8, 16, 32, 64, 128)),
        max_num_batched_tokens=engine.integer("maxNumBatchedTokens", default=2048, minimum=1),
        max_num_seqs=engine.integer("maxNumSeqs", default=256, minimum=1, maximum=4096),
        gpu_memory_utilization=engine.number(
            "gpuMemoryUtilization", default=0.9, above=0.0, maximum=1.0
        ),
        enable_prefix_caching=engine.boolean("enablePrefixCaching", default=True),
    )


def _router(router: Reader, autoscaling: Reader) -> RouterSpec:
    service = router.child("service")
    resources = router.mapping("resources")
    return RouterSpec(
        pool=RoleSpec(
            "router",
            replicas=router.integer("replicas", default=1, minimum=1),
            resources=resources,
            scaling=read_scaling(autoscaling, "router", resources),
            pod=read_pod_overrides(router.child("podTemplate"), "router"),
        ),
        policy=router.string("policy", default="kv-aware", choices=POLICIES),
        tool_call_parser=router.string("toolCallParser", default="auto", choices=TOOL_CALL_PARSERS),
        service_type=service.string(
            "type", default="ClusterIP", choices=("ClusterIP", "NodePort", "LoadBalancer")
        ),
        service_port=service.integer("port", default=8000, minimum=1, maximum=65535),
        api_key=_secret_ref(router, "apiKeySecretRef"),
    )


def _pool(pool: Reader, role: str, min_replicas: int, autoscaling: Reader) -> RoleSpec:
    resources = pool.mapping("resources")
    pod = read_pod_overrides(pool.child("podTemplate"), role)
    return RoleSpec(
        role,
        replicas=pool.integer("replicas", default=1, minimum=min_replicas),
        tensor_parallel_size=pool.integer("tensorParallelSize", default=1, choices=(1, 2, 4, 8)),
        resources=resources,
        node_selector=pool.mapping("nodeSelector"),
        tolerations=pool.sequence("tolerations"),
        affinity=pool.mapping("affinity"),
        env=pool.sequence("env"),
        scaling=read_scaling(autoscaling, role, resources),
        pod=pod,
        kv_tiers=read_kv_tiers(pool, pod.security),
    )


def _pod_monitor(monitor: Reader) -> PodMonitorSpec | None:
    if not monitor.boolean("enabled", default=monitor.present):
        return None
    return PodMonitorSpec(
        interval=monitor.string("interval", default="15s", pattern=r"[0-9]+(ms|s|m|h)"),
        labels=monitor.mapping("labels"),
        scraper_namespace=monitor.string("scraperNamespace", default="monitoring"),
    )


def _secret_ref(parent: Reader, key: str) -> SecretKeyRef | None:
    if not parent.has(key):
        return None
    ref = parent.child(key)
    return SecretKeyRef(
        ref.string("name", required=True, min_length=1),
        ref.string("key", required=True, min_length=1),
    )
