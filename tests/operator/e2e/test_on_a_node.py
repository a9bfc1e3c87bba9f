"""The user's journey on a real node: `helm install` the chart (the operator runs as a pod
under the chart's ServiceAccount), apply an LLMDeployment serving the real
SmolLM2-135M-Instruct on CPU, and talk to it with the official openai client through the
router's Service (a ClusterIP through kube-proxy, and `kubectl port-forward`).

Needs the node (`node.py`) and the image (`make e2e-image`); skipped, saying which is
missing, elsewhere. Figures (cold start, the KV transfer) are printed and written to
$TANDEM_E2E_REPORT when it is set."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tandem.operator.names import METRICS_PORT
from tandem.operator.render import render
from tests.bounds import HANG_S
from tests.disagg.nodes import free_port, metric_value, wait_until
from tests.operator.e2e.cluster import chart_objects
from tests.operator.e2e.helpers import (
    events,
    expected_children,
    get_child,
    patch_spec,
)
from tests.operator.e2e.journey import (
    MODEL_FOLDER,
    MODEL_NAME,
    Served,
    StreamLoad,
    is_ready,
    pod_timeline,
    report,
)
from tests.operator.e2e.node import STATE
from tests.operator.e2e.pairing import Pairings
from tests.operator.e2e.scrape import NO_PROMETHEUS, kubernetes_prometheus, pod_monitor_jobs
from tests.router.prometheus import Prometheus
from tests.router.test_prometheus import RULES, dashboard_queries, rules

pytestmark = pytest.mark.e2e
START_S = 900  # cold start bound: a hang, not a slow machine, reaches it
PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def prometheus(ready, cluster, tmp_path_factory):
    """Started with the deployment Ready and kept to the end of the module, so it scrapes
    every pod the journey starts and every fault it causes; None without a Prometheus that
    has Kubernetes discovery."""
    program = kubernetes_prometheus()
    if program is None:  # the journey goes on; the test that needs it says why it skips
        yield None
        return
    workdir = tmp_path_factory.mktemp("prometheus")
    token = workdir / "token"
    token.write_text(cluster.plane.admin_token)
    live = ready.resource()
    live["spec"]["monitoring"] = {"podMonitor": {}}
    monitors = [o for o in render(live) if o["kind"] == "PodMonitor"]
    chart = chart_objects(ready.operator_namespace, [ready.namespace],
                          metrics={"podMonitor": {"enabled": True}})  # fmt: skip
    monitors += [o for o in chart if o["kind"] == "PodMonitor"]
    assert len(monitors) == 2
    plane = cluster.plane
    jobs = [job for m in monitors for job in pod_monitor_jobs(m, plane.server, plane.ca, token)]
    server = Prometheus(workdir, jobs, [RULES], program).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(ready) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ready.router_url()}/v1", api_key="unused", timeout=300)


def test_the_operator_runs_as_a_pod_under_the_charts_service_account(served):
    (pod,) = served.operator_pods()
    assert pod["spec"]["serviceAccountName"] == "tandem"
    assert pod["spec"]["containers"][0]["image"] == served.image
    assert pod["spec"]["containers"][0]["args"][0] == "operator"
    assert is_ready(pod)


def test_the_deployment_becomes_ready_and_its_cold_start_is_split(ready, prometheus):
    live = ready.resource()
    assert live["status"]["phase"] == "Ready"
    split = {}
    for role in ("prefill", "decode", "router"):
        (pod,) = ready.pods(role)
        split[role] = pod_timeline(pod)
        assert split[role]["image_s"] >= 0 and split[role]["ready_s"] >= 0
    report("cold_start_s", split)


def test_readiness_means_a_first_request_is_served(ready, client):
    """The router's Service had endpoints only once it saw a healthy decode worker: the
    first request after Ready is answered, not refused with 503."""
    r = client.chat.completions.create(model=MODEL_NAME, messages=PROMPT, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_the_openai_client_through_the_cluster_ip(client):
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=PROMPT, max_tokens=16, temperature=0
    )
    assert chat.usage.completion_tokens > 0 and chat.choices[0].message.content
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=PROMPT, max_tokens=16, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content
    two = client.chat.completions.create(model=MODEL_NAME, messages=PROMPT, max_tokens=8, n=2)
    assert [c.index for c in two.choices] == [0, 1]


def test_structured_outputs_and_tools_through_the_cluster_ip(client):
    schema = {
        "type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
        "required": ["colour"], "additionalProperties": False,
    }  # fmt: skip
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=PROMPT, max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )  # fmt: skip
    assert set(json.loads(r.choices[0].message.content)) == {"colour"}
    tool = {"type": "function", "function": {"name": "paint", "parameters": schema}}
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=PROMPT, max_tokens=48, tools=[tool], tool_choice="required",
        parallel_tool_calls=False, temperature=0,
    )  # fmt: skip
    # one call, then the grammar ends the message (parallel calls may run to max_tokens)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "paint"
    assert set(json.loads(call.function.arguments)) == {"colour"}


def test_the_kv_cache_crosses_from_the_prefill_pod_to_the_decode_pod_over_nixl(ready, client):
    """Every prompt took the remote path (threshold 0): the prefill pod wrote its KV blocks
    into the decode pod's over NIXL (UCX over TCP between the two pods' addresses). The
    router may be Ready (a healthy decode worker) before it has found the prefill pod, and
    prefills locally until then: wait for it to use both."""
    follows = lambda: ready.routers_follow("prefill", 1) and ready.routers_follow("decode", 1)  # noqa: E731
    assert wait_until(follows, timeout=HANG_S)
    client.chat.completions.create(model=MODEL_NAME, messages=PROMPT, max_tokens=4)
    (prefill_ip,) = ready.ready_ips("prefill")
    (decode_ip,) = ready.ready_ips("decode")
    prefill = f"http://{prefill_ip}:{METRICS_PORT}/metrics"
    written = sum_metric(prefill, "tandem_kv_transfer_bytes_total")
    seconds = sum_metric(prefill, "tandem_kv_transfer_seconds_sum")
    decode = f"http://{decode_ip}:{METRICS_PORT}/metrics"
    remote = sum_metric(decode, "tandem_disagg_decisions_total", decision="remote")
    assert written > 0 and seconds > 0 and remote > 0
    report("nixl_transfer", {"bytes": written, "seconds": round(seconds, 4),
                             "mb_per_s": round(written / seconds / 1e6, 1)})  # fmt: skip


def test_kubectl_port_forward_reaches_the_router(ready, cluster):
    port = free_port()
    kubectl = cluster.plane.bin / "kubectl"
    forward = subprocess.Popen(
        [str(kubectl), "--kubeconfig", str(cluster.plane.dir / "admin.kubeconfig"),
         "-n", ready.namespace, "port-forward", f"svc/{ready.name}-router", f"{port}:8000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert "Forwarding from" in forward.stdout.readline()
        local = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=300)
        models = [m.id for m in local.models.list()]
        assert models == [MODEL_NAME]
        r = local.chat.completions.create(model=MODEL_NAME, messages=PROMPT, max_tokens=4)
        assert r.usage.completion_tokens > 0
    finally:
        forward.terminate()
        forward.wait()


def test_greedy_output_equals_tandem_serve_on_the_same_model(client, tmp_path):
    """The cluster's answer and a local `tandem serve` of the same folder, token for token."""
    prompts = [PROMPT, [{"role": "user", "content": "What is 2 + 2?"}]]
    in_cluster = [_greedy(client, p) for p in prompts]
    port = free_port()
    model = STATE / "models" / MODEL_FOLDER
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "tandem.cli", "serve", "--model", str(model),
         "--port", str(port), "--dtype", "float32"],  # the journey's dtype
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _healthy(url), timeout=START_S), tmp_path / "serve.log"
        local = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=300)
        assert [_greedy(local, p) for p in prompts] == in_cluster
    finally:
        proc.terminate()
        proc.wait(120)
        log.close()


def test_a_spec_change_rolls_a_new_revision_under_load_with_no_failed_request(ready):
    """A revision that changes the engine (every pod's template) rolls while 8 clients
    stream: every request finishes, and traffic flows on the new pods afterwards."""
    before = ready.resource()["status"]["revision"]
    with Pairings(ready) as pairs, StreamLoad(ready.router_url()) as load:
        assert wait_until(lambda: load.count() >= 8, timeout=HANG_S)
        started = time.monotonic()
        patch_spec(ready.api, ready.ref(), {"engine": {"maxNumSeqs": 64}})
        assert wait_until(lambda: ready.rolled_from(before), timeout=START_S), ready.resource()
        rolled_s = time.monotonic() - started
        after = ready.resource()["status"]["revision"]
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 8, timeout=HANG_S)
        # the streams that finish first may be ones the old pods were draining: wait for a
        # prompt the new revision's prefill pods logged
        assert wait_until(lambda: after in pairs.served_revisions(), timeout=HANG_S)
    assert load.failures() == [], load.failures()[:3]
    # no prompt prefilled by one revision went on to decode on the other
    assert pairs.mixed() == [] and pairs.unknown() == set()
    assert pairs.served_revisions() == {before, after}  # both were seen
    report("rollout", {"seconds": round(rolled_s, 1), "requests": load.count(), "failed": 0,
                       "pairs_read": len(pairs.pairs)})  # fmt: skip


def test_a_deleted_decode_pod_is_replaced_and_adopted(ready):
    """In-flight streams on the deleted pod end as docs/router.md says (finished, or an
    error event once tokens were sent; none hangs); while no decode pod is ready the router
    stays in its Service and answers 503 with Retry-After (no refused connection); then it
    drops the pod and serves on its replacement."""
    load, adopted_s = _replaced_under_load(ready, "decode")
    documented = ("no decode worker is available", "decode worker failed mid-stream")
    undocumented = [o for o in load.failures() if not any(d in o.error for d in documented)]
    assert undocumented == [], undocumented[:3]
    report("decode_pod_deleted", {
        "adopted_s": round(adopted_s, 1), "requests": load.count(),
        "refused_503": sum(documented[0] in o.error for o in load.failures()),
        "broken_streams": sum(documented[1] in o.error for o in load.failures()),
    })  # fmt: skip


def test_a_deleted_prefill_pod_is_replaced_with_no_failed_request(ready):
    """`kubectl delete pod`: the pod drains (its endpoint gone, requests it holds finish)
    while its replacement starts; the router adopts the replacement, no request fails."""
    load, adopted_s = _replaced_under_load(ready, "prefill")
    assert load.failures() == [], load.failures()[:3]
    report("prefill_pod_deleted", {"adopted_s": round(adopted_s, 1), "requests": load.count()})


def test_a_killed_prefill_pod_makes_decode_fall_back(ready):
    """The prefill pod killed at once (grace 0, as a crash): a prompt sent to it falls
    back on the decode pod, counted, and prompts meanwhile are prefilled there (counted
    too); no request fails."""
    (old,) = ready.current("prefill")
    (decode_ip,) = ready.ready_ips("decode")
    metrics = f"http://{decode_ip}:{METRICS_PORT}/metrics"
    fallbacks = lambda: sum_metric(metrics, "tandem_prefill_fallbacks_total")  # noqa: E731
    local = lambda: sum_metric(metrics, "tandem_disagg_decisions_total", decision="local")  # noqa: E731
    before = {"fallbacks": fallbacks(), "local": local()}
    with StreamLoad(ready.router_url()) as load:
        assert wait_until(lambda: load.count() >= 8, timeout=HANG_S)
        ready.delete_pod(old, grace_s=0)
        assert wait_until(lambda: fallbacks() + local() > sum(before.values()), timeout=HANG_S)
        assert wait_until(lambda: _adopted(ready, "prefill", old), timeout=START_S)
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 8, timeout=HANG_S)
    assert load.failures() == [], load.failures()[:3]
    report("prefill_pod_killed", {
        "fallbacks": fallbacks() - before["fallbacks"], "local_prefills": local() - before["local"],
        "requests": load.count(),
    })  # fmt: skip


def test_kv_tiers_on_the_decode_pool_roll_it_and_its_pod_serves_with_them(ready):
    """`spec.decode.kvTiers` (a host tier, and a disk tier on the default emptyDir, under
    restricted Pod Security) rolls the decode pool under load with no failed request; its
    new pod has both tiers (their capacity on its metrics) and the routers use it."""
    tiers = {"host": {"size": "64Mi"}, "disk": {"size": "128Mi"}}
    with StreamLoad(ready.router_url()) as load:
        assert wait_until(lambda: load.count() >= 8, timeout=HANG_S)
        started = time.monotonic()
        patch_spec(ready.api, ready.ref(), {"decode": {"kvTiers": tiers}})
        assert wait_until(lambda: _decode_tiered(ready), timeout=START_S)
        rolled_s = time.monotonic() - started
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 8, timeout=HANG_S)
    assert load.failures() == [], load.failures()[:3]
    (decode_ip,) = ready.ready_ips("decode")
    metrics = f"http://{decode_ip}:{METRICS_PORT}/metrics"
    for tier in ("host", "disk"):
        assert sum_metric(metrics, "tandem_kv_tier_capacity_blocks", tier=tier) > 0, tier
    report("decode_kv_tiers", {"rolled_s": round(rolled_s, 1), "requests": load.count()})


def _decode_tiered(ready: Served) -> bool:
    """The decode pool's one pod runs with the tiers' flags, Ready, and the routers use it."""
    pods = ready.current("decode")
    if len(pods) != 1 or not is_ready(pods[0]):
        return False
    args = pods[0]["spec"]["containers"][0].get("args", [])
    return "--kv-disk-dir" in args and ready.routers_follow("decode", 1)


def _replaced_under_load(ready: Served, role: str) -> tuple[StreamLoad, float]:
    """The role's one pod deleted under 8 streams: the load, once a replacement is adopted
    and 8 more requests ended, and the seconds from the deletion to the adoption."""
    (old,) = ready.current(role)
    with StreamLoad(ready.router_url()) as load:
        assert wait_until(lambda: load.count() >= 8, timeout=HANG_S)
        started = time.monotonic()
        ready.delete_pod(old)
        assert wait_until(lambda: _adopted(ready, role, old), timeout=START_S)
        adopted_s = time.monotonic() - started
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 8, timeout=HANG_S)
    return load, adopted_s


def _adopted(ready: Served, role: str, old: dict) -> bool:
    """A replacement for `old`, Ready, is the role's one pod, and the routers use it."""
    return old["status"]["podIP"] not in ready.ready_ips(role) and ready.routers_follow(role, 1)


def test_replicas_and_an_autoscalers_bounds_are_followed_by_the_routers(ready):
    """Two routers, two decode pods (replicas) and two prefill pods (an HPA's minReplicas,
    which its controller enforces without metrics): every router uses every Ready pod."""
    started = time.monotonic()
    patch_spec(ready.api, ready.ref(), {
        "router": {"replicas": 2}, "decode": {"replicas": 2},
        "autoscaling": {"prefill": {"minReplicas": 2, "maxReplicas": 3}},
    })  # fmt: skip
    followed = {}
    for role in ("decode", "prefill"):
        assert wait_until(lambda r=role: ready.routers_follow(r, 2), timeout=START_S), role
        followed[role] = round(time.monotonic() - started, 1)
    assert wait_until(lambda: len(ready.ready_ips("router")) == 2, timeout=START_S)
    assert wait_until(lambda: ready.routers_follow("decode", 2), timeout=HANG_S)
    report("scaled_to_two_followed_s", followed)


def test_one_of_two_routers_deleted_the_service_keeps_answering(ready):
    """kube-proxy sends the Service's traffic to the router left while the other drains
    (its endpoint removed before it stops): no request fails."""
    old = sorted(ready.current("router"), key=lambda p: p["metadata"]["name"])[0]
    gone = old["status"]["podIP"]
    with StreamLoad(ready.router_url()) as load:
        assert wait_until(lambda: load.count() >= 8, timeout=HANG_S)
        ready.delete_pod(old)
        assert wait_until(lambda: gone not in ready.ready_ips("router"), timeout=HANG_S)
        assert wait_until(lambda: len(ready.ready_ips("router")) == 2, timeout=START_S)
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 8, timeout=HANG_S)
    assert load.failures() == [], load.failures()[:3]
    report("router_pod_deleted", {"requests": load.count(), "failed": 0})


def test_the_operator_pod_deleted_serving_goes_on_and_nothing_is_rewritten(ready):
    """The Deployment brings a new operator pod; it reconciles the settled resource (its
    metrics count the reconcile) and changes no child (their contents but the status the
    controllers keep writing), while requests keep being served."""
    before = child_contents(ready.api, ready.resource())
    (old,) = ready.operator_pods()

    def reconciled_by_a_new_pod() -> bool:
        for pod in ready.operator_pods():
            if pod["metadata"]["name"] != old["metadata"]["name"] and is_ready(pod):
                url = f"http://{pod['status']['podIP']}:8080/metrics"
                return sum_metric(url, "tandem_operator_reconciles_total") > 0
        return False

    with StreamLoad(ready.router_url(), concurrency=2) as load:
        ready.delete_pod(old)
        assert wait_until(reconciled_by_a_new_pod, timeout=START_S)
        served = load.count()
        assert wait_until(lambda: load.count() >= served + 4, timeout=HANG_S)
    assert load.failures() == []
    assert child_contents(ready.api, ready.resource()) == before


# Targets this CPU never meets: under load every layout misses them and the planner plans the
# maximum; with fewer than 10 requests an interval it plans the minimum. 8 streams end more
# than 10 requests in 10 s even on a loaded machine, one client pausing 2 s between requests
# fewer on any; the window keeps a scale-up while its pod starts on a slow machine.
UNMET_SLO = {
    "ttftMs": 1, "tpotMs": 1, "interval": "10s", "scaleDownWindow": "60s", "cooldown": "5s",
    "decode": {"minReplicas": 1, "maxReplicas": 2},
}  # fmt: skip


def test_the_slo_planner_follows_the_load_and_its_scale_down_fails_nothing(ready):
    """`spec.slo` planning the decode pool (1..2): the planner's pod scales it up under 8
    streams within an interval or two, and down once the load fell to a trickle for a
    whole window, while the trickle goes on: no request fails. Its decisions are in
    `status.planner`, in `Scaled` Events and in its metrics."""
    patch_spec(ready.api, ready.ref(), {"decode": {"replicas": 1}})
    assert wait_until(lambda: ready.routers_follow("decode", 1), timeout=START_S)
    patch_spec(ready.api, ready.ref(), {"slo": UNMET_SLO})
    assert wait_until(lambda: any(is_ready(p) for p in ready.current("planner")), timeout=START_S)
    with StreamLoad(ready.router_url()) as load:
        started = time.monotonic()
        assert wait_until(lambda: ready.routers_follow("decode", 2), timeout=START_S)
        up_s = time.monotonic() - started
    assert load.failures() == [], load.failures()[:3]
    planner = ready.resource()["status"]["planner"]  # held at 2 for the window
    assert planner["decode"]["desired"] == 2, planner
    with StreamLoad(ready.router_url(), concurrency=1, pause_s=2.0) as trickle:
        started = time.monotonic()
        assert wait_until(lambda: ready.routers_follow("decode", 1), timeout=START_S)
        down_s = time.monotonic() - started
        served = trickle.count()
        assert wait_until(lambda: trickle.count() >= served + 4, timeout=HANG_S)
    assert trickle.failures() == [], trickle.failures()[:3]
    scaled = [e for e in events(ready.api, ready.resource()) if e["reason"] == "Scaled"]
    assert all(e["source"]["component"] == "tandem-planner" for e in scaled)
    messages = [e["message"] for e in scaled]
    assert any("no layout within the bounds" in m and "+1D -> " in m for m in messages), messages
    assert any("planned the minimum" in m and "+2D -> " in m for m in messages), messages
    (pod,) = [p for p in ready.current("planner") if is_ready(p)]
    metrics = f"http://{pod['status']['podIP']}:9090/metrics"
    for direction in ("up", "down"):
        assert sum_metric(metrics, "tandem_planner_scalings_total", direction=direction) >= 1
    decision_s = sum_metric(metrics, "tandem_planner_decision_seconds_sum") / max(
        1.0, sum_metric(metrics, "tandem_planner_decision_seconds_count"))  # fmt: skip
    report("slo_planner", {
        "scaled_up_s": round(up_s, 1), "scaled_down_s": round(down_s, 1),
        "requests": load.count() + trickle.count(), "failed": 0,
        "mean_decision_s": round(decision_s, 2),
    })  # fmt: skip


def child_contents(api, live: dict) -> dict[str, dict]:
    """Every child as the operator owns it: without status and the server's bookkeeping
    (resourceVersion, managedFields), which other controllers move."""
    found = {}
    for obj in expected_children(live):
        child = get_child(api, obj)
        child.pop("status", None)
        for key in ("resourceVersion", "managedFields"):
            child["metadata"].pop(key, None)
        found[f"{obj['kind']}/{obj['metadata']['name']}"] = child
    return found


def sum_metric(url: str, name: str, **labels: str) -> float:
    return metric_value(httpx.get(url, timeout=HANG_S).text, name, **labels)


def _greedy(client: openai.OpenAI, messages: list[dict]) -> str:
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0
    )
    return r.choices[0].message.content


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_prometheus_finds_every_pod_and_every_dashboard_query_has_data(ready, prometheus):
    """Prometheus, configured as the Prometheus Operator configures it for the two
    PodMonitors (the resource's and the chart's), has scraped every pod since the start:
    every dashboard query and recording rule returns data (GPU panels aside: no GPU here),
    the fault counters' panels included (0, not "No data"), and `up` by role."""
    if prometheus is None:
        pytest.skip(f"no Prometheus with Kubernetes discovery: {NO_PROMETHEUS}")
    queries = {k: q for k, q in dashboard_queries().items() if "GPU" not in k and "Tensor" not in k}
    expected = queries | {f"record {name}": name for name in rules()[0]}
    up = 'count by (tandem_dev_deployment, tandem_dev_role) (up{namespace="%s"} == 1)'
    expected["up by role"] = up % ready.namespace

    def empty() -> list[str]:
        return [key for key, q in expected.items() if not prometheus.series(q)]

    wait_until(lambda: not empty(), timeout=HANG_S, interval=1.0)
    missing = empty()
    assert not missing, "no data: " + "; ".join(missing)
    roles = {s["metric"]["tandem_dev_role"] for s in prometheus.series(expected["up by role"])}
    assert roles == {"router", "prefill", "decode", "planner"}  # the planner: spec.slo is on
    assert prometheus.series(f'up{{namespace="{ready.operator_namespace}"}} == 1')
    assert prometheus.series("up == 0") == []
    report("prometheus", {"queries_with_data": len(expected), "targets": len(
        prometheus.api("targets")["activeTargets"])})  # fmt: skip
