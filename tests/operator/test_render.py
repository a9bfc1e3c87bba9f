"""render(): golden files, strict validation of every object, and the contracts the
children hold with the rest of Tandem (flags, labels, ports, discovery)."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from prometheus_client import CollectorRegistry

from tandem.cli import apply_config
from tandem.node.server import NodeServer
from tandem.operator.manifest import dump
from tandem.operator.names import REVISION_LABEL, ROLE_LABEL
from tandem.operator.render import render
from tandem.router.discovery import workers_from_endpoint_slices
from tests.operator.crd_schema import example

GOLDEN = Path(__file__).parent / "golden"
VERSIONS = ["1.30.0", f"{latest_version()}.0"]
UPDATE = os.environ.get("TANDEM_UPDATE_GOLDEN") == "1"


def by_key(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize("name", ["minimal", "full", "tensor-parallel", "kv-tiers", "slo"])
def test_golden(name):
    """Set TANDEM_UPDATE_GOLDEN=1 to rewrite the files after an intended change."""
    text = dump(render(example(name)))
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["minimal", "full", "kv-tiers"])
def test_every_object_is_valid_kubernetes(name, version):
    checked = 0
    for obj in render(example(name)):
        if obj["kind"] == "PodMonitor":  # a prometheus-operator CRD: checked below
            continue
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 14


def test_render_is_pure_and_deterministic():
    llmd = example("full")
    before = copy.deepcopy(llmd)
    first = render(llmd)
    assert llmd == before
    assert render(llmd) == first
    assert all(o["metadata"]["ownerReferences"][0]["controller"] for o in first)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.pop("model"), "spec.model: is required"),
        (lambda s: s["decode"].update(replicas=-1), "spec.decode.replicas: must be at least 1"),
        (lambda s: s["prefill"].update(replicas="2"), "spec.prefill.replicas: must be an integer"),
        (lambda s: s["router"].update(policy="random"), "spec.router.policy: must be one of"),
        (lambda s: s["model"]["source"].update(pvc={"claimName": "m"}),
         "spec.model.source: exactly one"),
        (lambda s: s["autoscaling"]["decode"].update(minReplicas=99),
         "spec.autoscaling.decode: minReplicas"),
        (lambda s: s["autoscaling"].update(router={"maxReplicas": 3,
         "target": {"metric": "kvCacheUsage", "value": 0.5}}),
         "spec.autoscaling.router.target.metric"),
        (lambda s: s["engine"].update(gpuMemoryUtilization=1.5),
         "spec.engine.gpuMemoryUtilization"),
        (lambda s: s["router"]["apiKeySecretRef"].pop("key"), "spec.router.apiKeySecretRef.key"),
        (lambda s: s["decode"].update(tensorParallelSize=3), "spec.decode.tensorParallelSize"),
    ],
)  # fmt: skip
def test_invalid_spec_names_the_field(edit, field):
    llmd = example("full")
    edit(llmd["spec"])
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        render(llmd)


def test_a_name_too_long_for_the_children_is_refused():
    llmd = example("minimal")
    llmd["metadata"]["name"] = "x" * 41
    with pytest.raises(ValueError, match=r"metadata\.name"):
        render(llmd)


def _revision(llmd):
    return by_key(render(llmd))[("Deployment", "qwen-decode")]["spec"]["template"]["metadata"][
        "labels"
    ][REVISION_LABEL]


@pytest.mark.parametrize(
    ("edit", "changes"),
    [
        (lambda s: s["engine"].update(blockSize=32), True),
        (lambda s: s["model"].update(dtype="float16"), True),
        (lambda s: s.update(image="tandem:next"), True),
        (
            lambda s: s["decode"].update(tensorParallelSize=8),
            True,
        ),
        (lambda s: s["model"]["source"]["huggingFace"].update(revision="v2"), True),
        (lambda s: s["decode"].update(replicas=9), False),
        (lambda s: s["router"].update(policy="round-robin"), False),
        (lambda s: s["model"]["source"]["huggingFace"]["tokenSecretRef"].update(name="t"), False),
    ],
)
def test_revision_tracks_exactly_what_changes_the_engine(edit, changes):
    llmd = example("full")
    before = _revision(llmd)
    edit(llmd["spec"])
    assert (_revision(llmd) != before) is changes


def test_prefill_and_decode_share_the_revision():
    objects = by_key(render(example("full")))
    labels = [objects[("Deployment", f"qwen-{r}")]["spec"]["template"]["metadata"]["labels"]
              for r in ("prefill", "decode")]  # fmt: skip
    assert labels[0][REVISION_LABEL] == labels[1][REVISION_LABEL]


def test_zero_prefill_replicas_render_no_prefill_pool():
    llmd = example("minimal")
    llmd["spec"]["prefill"] = {"replicas": 0}
    names = {name for _, name in by_key(render(llmd))}
    assert not any("prefill" in n for n in names)
    assert "llama-decode" in names
    config = by_key(render(llmd))[("ConfigMap", "llama-config")]["data"]
    assert set(config) == {"router.json", "decode.json"}


def test_autoscaled_roles_leave_replicas_to_the_hpa():
    llmd = example("full")
    objects = by_key(render(llmd))
    assert "replicas" not in objects[("Deployment", "qwen-decode")]["spec"]
    del llmd["spec"]["autoscaling"]["router"]
    assert by_key(render(llmd))[("Deployment", "qwen-router")]["spec"]["replicas"] == 2
    hpa = objects[("HorizontalPodAutoscaler", "qwen-decode")]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 16)
    assert hpa["metrics"][0]["pods"] == {
        "metric": {"name": "tandem_kv_cache_usage_ratio"},
        "target": {"type": "AverageValue", "averageValue": "800m"},
    }


def _container(objects, role, name="qwen"):
    return objects[("Deployment", f"{name}-{role}")]["spec"]["template"]["spec"]["containers"][0]


def test_gpus_default_to_the_tensor_parallel_size():
    tensor_parallel = by_key(render(example("tensor-parallel")))
    decode = _container(tensor_parallel, "decode", "llama-70b")
    assert decode["resources"]["limits"]["nvidia.com/gpu"] == 2
    objects = by_key(render(example("full")))
    assert _container(objects, "prefill")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in _container(objects, "router").get("resources", {}).get(
        "limits", {}
    )
    llmd = example("full")
    llmd["spec"]["prefill"]["resources"]["limits"]["nvidia.com/gpu"] = 0
    assert (
        "nvidia.com/gpu" not in _container(by_key(render(llmd)), "prefill")["resources"]["limits"]
    )


def test_tensor_parallel_size_reaches_each_engine_with_shared_memory():
    """`tensorParallelSize` becomes the role's --tensor-parallel-size (its `<role>.json`),
    and the pod's /dev/shm is a memory-backed emptyDir (NCCL's buffers between ranks)."""
    objects = by_key(render(example("tensor-parallel")))
    config = objects[("ConfigMap", "llama-70b-config")]["data"]
    for role, size in (("prefill", 1), ("decode", 2)):
        assert json.loads(config[f"{role}.json"])["tensor-parallel-size"] == size
        pod = objects[("Deployment", f"llama-70b-{role}")]["spec"]["template"]["spec"]
        mount = next(
            m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"
        )
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"]["medium"] == "Memory"
    assert "tensor-parallel-size" not in json.loads(config["router.json"])
    # prefill plans the staging its writes into a finer split of the heads need
    assert json.loads(config["prefill.json"])["peer-tensor-parallel-sizes"] == [2]


def test_pods_are_hardened_and_probed():
    for obj in render(example("full")):
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"] + pod.get("initContainers", []):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            assert set(security["capabilities"].get("add", [])) <= {"IPC_LOCK"}  # podTemplate
        main = pod["containers"][0]
        assert {"readinessProbe", "livenessProbe", "startupProbe"} <= set(main)
        mounts = {m["mountPath"] for m in main["volumeMounts"]}
        assert {"/dev/shm", "/models", "/etc/tandem", "/tmp"} <= mounts


def test_a_nodes_liveness_checks_its_engine_and_startup_stays_tcp():
    """A stuck engine thread restarts a node (its /health/live fails); a loading model is
    never killed (the startup probe only needs the port); the router, which has no engine
    thread, stays alive while its port answers."""
    node_paths = {r.path for r in NodeServer(None, CollectorRegistry()).metrics_app.routes}
    probed = 0
    for obj in render(example("full")):
        if obj["kind"] != "Deployment":
            continue
        role = obj["spec"]["template"]["metadata"]["labels"][ROLE_LABEL]
        main = obj["spec"]["template"]["spec"]["containers"][0]
        port = "http" if role == "router" else "metrics"
        assert main["startupProbe"]["tcpSocket"] == {"port": port}, role
        assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}, role
        if role == "router":
            assert "tcpSocket" in main["livenessProbe"]
        else:
            live = {"path": "/health/live", "port": "metrics"}
            assert main["livenessProbe"]["httpGet"] == live
            assert {"/health", "/health/live"} <= node_paths  # what the metrics port serves
            probed += 1
    assert probed == 2  # prefill and decode


def test_hugging_face_source_downloads_with_the_token():
    llmd = example("full")
    del llmd["spec"]["model"]["cache"]
    llmd["spec"]["decode"].pop("podTemplate")
    objects = by_key(render(llmd))
    for role in ("router", "prefill", "decode"):
        (init,) = objects[("Deployment", f"qwen-{role}")]["spec"]["template"]["spec"][
            "initContainers"
        ]
        assert init["args"][:3] == ["Qwen/Qwen3-32B", "9216db5781bf21249d130ec9da846c4624c16137",
                                    "/models/model"]  # fmt: skip
        token = next(e for e in init["env"] if e["name"] == "HF_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        # the router fetches the tokenizer and config, never the weights
        assert ("*.json" in init["args"]) is (role == "router")


def test_api_key_secret_reaches_the_router_only():
    objects = by_key(render(example("full")))
    env = {e["name"]: e for e in _container(objects, "router")["env"]}
    assert env["TANDEM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "tandem-api-key",
        "key": "key",
    }
    assert "TANDEM_API_KEY" not in {e["name"] for e in _container(objects, "decode")["env"]}


def test_user_env_overrides_ours_without_duplicates():
    objects = by_key(render(example("full")))
    names = [e["name"] for e in _container(objects, "decode")["env"]]
    assert len(names) == len(set(names))
    offline = next(e for e in _container(objects, "decode")["env"] if e["name"] == "HF_HUB_OFFLINE")
    assert "configMapKeyRef" in offline["valueFrom"]


@pytest.mark.parametrize("name", ["minimal", "full"])
def test_role_configs_are_accepted_by_the_real_commands(name, tmp_path):
    """Each `<role>.json` in the ConfigMap is read by `tandem <role> --config` as is."""
    import argparse
    import importlib

    config = next(o for o in render(example(name)) if o["kind"] == "ConfigMap")["data"]
    for file_name, text in config.items():
        role = file_name.removesuffix(".json")
        parser = argparse.ArgumentParser()
        importlib.import_module(f"tandem.{role}_node.cli" if role != "router" else
                                "tandem.router.cli").add_arguments(parser)  # fmt: skip
        path = tmp_path / file_name
        path.write_text(text)
        apply_config(parser, str(path))
        args = parser.parse_args([])
        for flag, value in json.loads(text).items():
            assert getattr(args, flag.replace("-", "_")) == value


def test_container_ports_match_the_flags_and_the_services():
    objects = by_key(render(example("full")))
    config = objects[("ConfigMap", "qwen-config")]["data"]
    for role in ("router", "prefill", "decode"):
        flags = json.loads(config[f"{role}.json"])
        ports = {p["name"]: p["containerPort"] for p in _container(objects, role)["ports"]}
        assert ports["http"] == flags.get("http-port", flags.get("port"))
        if role != "router":
            assert ports["metrics"] == flags["metrics-port"]
        if role == "prefill":
            assert (ports["zmq"], ports["events"]) == (flags["zmq-port"], flags["events-port"])
        if role == "decode":
            assert ports["events"] == flags["zmq-port"]
        service = objects[("Service", f"qwen-{role}")]["spec"]
        assert {p["targetPort"] for p in service["ports"]} <= set(ports)


def test_router_discovers_the_rendered_services():
    """The router reads roles from EndpointSlices, which carry their Service's labels."""
    objects = by_key(render(example("full")))
    router_flags = json.loads(objects[("ConfigMap", "qwen-config")]["data"]["router.json"])
    key, value = router_flags["selector"].split("=")
    slices = []
    for role in ("router", "prefill", "decode"):
        service = objects[("Service", f"qwen-{role}")]
        assert service["metadata"]["labels"][key] == value
        assert service["metadata"]["labels"][ROLE_LABEL] == role
        slices.append({
            "metadata": {"labels": service["metadata"]["labels"]},
            "ports": [{"name": p["name"], "port": p["port"]} for p in service["spec"]["ports"]],
            "endpoints": [{"addresses": [f"10.0.0.{len(slices)}"], "conditions": {"ready": True}}],
        })  # fmt: skip
    workers = workers_from_endpoint_slices(slices)
    assert sorted(w.role for w in workers) == ["decode", "prefill"]


def scraped_port(endpoints: list[dict], labels: dict[str, str], ports: set[str]) -> str:
    """The one port a pod with these labels and container port names is scraped on, as
    Prometheus applies the endpoints (each keeps pods with its port, then its relabelings;
    this test needs only `keep` on a pod label)."""
    sd_labels = {"__meta_kubernetes_pod_label_" + re.sub(r"\W", "_", k): v
                 for k, v in labels.items()}  # fmt: skip
    scraped = []
    for endpoint in endpoints:
        kept = endpoint["port"] in ports
        for rule in endpoint.get("relabelings", []):
            assert rule["action"] == "keep" and len(rule["sourceLabels"]) == 1
            value = sd_labels[rule["sourceLabels"][0]]
            kept = kept and re.fullmatch(rule["regex"], value) is not None
        if kept:
            scraped.append(endpoint["port"])
    (port,) = scraped
    return port


def test_pod_monitor_scrapes_each_pool_once_on_its_metrics_port():
    objects = render(example("full"))
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["path"] for e in endpoints} == {"/metrics"}
    scraped = {}
    for obj in objects:
        if obj["kind"] == "Deployment":
            template = obj["spec"]["template"]
            labels = template["metadata"]["labels"]
            assert selector.items() <= labels.items()
            ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
            scraped[labels[ROLE_LABEL]] = scraped_port(endpoints, labels, ports)
    assert scraped == {"router": "http", "prefill": "metrics", "decode": "metrics"}
    assert not any(o["kind"] == "PodMonitor" for o in render(example("minimal")))


def test_network_policy_opens_only_the_ports_each_peer_uses():
    objects = by_key(render(example("full")))
    policy = objects[("NetworkPolicy", "qwen-nodes")]["spec"]
    rules = {json.dumps(r["from"], sort_keys=True): r["ports"] for r in policy["ingress"]}
    router_rule = next(v for k, v in rules.items() if '"router"' in k)
    assert {p["port"] for p in router_rule} == {8000, 5558}
    node_rule = next(v for k, v in rules.items() if '"decode"' in k)
    assert {(p["port"], p.get("endPort")) for p in node_rule} == {
        (5557, None), (5558, None), (20000, 20999)
    }  # fmt: skip
    decode_env = {e["name"]: e.get("value") for e in _container(objects, "decode")["env"]}
    assert decode_env["UCX_TCP_PORT_RANGE"] == "20000-20999"
    scraper = next(v for k, v in rules.items() if "monitoring" in k)
    assert [p["port"] for p in scraper] == [8001]


def test_scrapers_reach_only_the_metrics_port_of_a_node():
    """Every rule that lets the scrapers' namespace in names one port, the containers'
    `metrics`, which no other rule opens (the control API, ZMQ, KV events and NIXL stay
    the deployment's own)."""
    objects = by_key(render(example("full")))
    ingress = objects[("NetworkPolicy", "qwen-nodes")]["spec"]["ingress"]
    scraper = [r for r in ingress if any("namespaceSelector" in f for f in r["from"])]
    assert [len(r["from"]) for r in scraper] == [1]
    (metrics,) = {p["containerPort"] for p in _container(objects, "decode")["ports"]
                  if p["name"] == "metrics"}  # fmt: skip
    assert [p["port"] for p in scraper[0]["ports"]] == [metrics]
    assert all("endPort" not in p for p in scraper[0]["ports"])
    others = {p["port"] for r in ingress if r not in scraper for p in r["ports"]}
    assert metrics not in others
    for rule in ingress:
        for peer in rule["from"]:
            assert "ipBlock" not in peer and ("namespaceSelector" in peer) == (rule in scraper)


def test_golden_files_parse_as_yaml():
    for path in GOLDEN.glob("*.yaml"):
        assert all(doc["metadata"]["namespace"] for doc in yaml.safe_load_all(path.read_text()))
