"""`spec.<role>.podTemplate`: what a platform adds is merged over the hardened defaults,
labels the operator relies on cannot be overridden, and a weakening is refused unless
`securityOverrides` names it, which the status and an Event then report."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tandem.operator.render import render
from tandem.operator.spec import parse
from tests.operator.crd_schema import example, validate

VERSIONS = ["1.30.0", f"{latest_version()}.0"]
SIDECAR = {"name": "proxy", "image": "envoyproxy/envoy:v1.31"}


def with_template(role: str, template: dict, name: str = "minimal") -> dict:
    llmd = example(name)
    llmd["spec"].setdefault(role, {})["podTemplate"] = copy.deepcopy(template)
    return llmd


def pod(llmd: dict, role: str) -> dict:
    (deployment,) = [o for o in render(llmd) if o["kind"] == "Deployment"
                     and o["metadata"]["name"].endswith(f"-{role}")]  # fmt: skip
    return deployment["spec"]["template"]


def refused(llmd: dict, field: str) -> str:
    with pytest.raises(ValueError) as caught:
        render(llmd)
    assert str(caught.value).startswith(field), caught.value
    return str(caught.value)


@pytest.mark.parametrize("role", ["router", "prefill", "decode"])
def test_every_addition_reaches_the_pod(role):
    template = {
        "labels": {"team": "ml"}, "annotations": {"example.com/owner": "platform"},
        "schedulerName": "gang", "priorityClassName": "high", "runtimeClassName": "nvidia",
        "volumes": [{"name": "extra", "emptyDir": {}}],
        "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
        "initContainers": [{"name": "prepare", "image": "busybox:1.36"}],
        "containers": [SIDECAR], "capabilities": ["IPC_LOCK"],
    }  # fmt: skip
    template_out = pod(with_template(role, template), role)
    spec = template_out["spec"]
    assert template_out["metadata"]["labels"]["team"] == "ml"
    assert template_out["metadata"]["labels"]["tandem.dev/role"] == role
    assert template_out["metadata"]["annotations"]["example.com/owner"] == "platform"
    assert (spec["schedulerName"], spec["priorityClassName"], spec["runtimeClassName"]) == (
        "gang", "high", "nvidia"
    )  # fmt: skip
    assert spec["volumes"][-1] == {"name": "extra", "emptyDir": {}}
    main, sidecar = spec["containers"]
    assert main["volumeMounts"][-1] == {"name": "extra", "mountPath": "/extra"}
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert sidecar["name"] == "proxy" and sidecar["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert spec["initContainers"][0]["name"] == "prepare"


def test_platform_init_containers_run_before_the_download():
    llmd = with_template("decode", {"initContainers": [{"name": "mesh", "image": "m:1",
                                     "restartPolicy": "Always"}]}, "full")  # fmt: skip
    del llmd["spec"]["model"]["cache"]
    assert [c["name"] for c in pod(llmd, "decode")["spec"]["initContainers"]] == [
        "mesh", "download"
    ]  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_template_renders_valid_kubernetes(version):
    template = {
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev/infiniband"}}],
        "volumeMounts": [{"name": "dev", "mountPath": "/dev/infiniband"}],
        "containers": [SIDECAR | {"securityContext": {"runAsUser": 0}}],
        "securityOverrides": {"runAsRoot": True, "privileged": True, "hostPathVolumes": True,
                              "writableRootFilesystem": True, "capabilities": ["SYS_ADMIN"]},
    }  # fmt: skip
    llmd = with_template("decode", template, "full")
    assert validate(llmd) == []
    for obj in render(llmd):
        if obj["kind"] != "PodMonitor":
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "label", ["tandem.dev/role", "tandem.dev/revision", "tandem.dev/deployment",
              "app.kubernetes.io/name", "tandem.dev/anything"],
)  # fmt: skip
def test_labels_the_operator_relies_on_cannot_be_overridden(label):
    message = refused(with_template("decode", {"labels": {label: "x"}}),
                      f"spec.decode.podTemplate.labels.{label}")  # fmt: skip
    assert "cannot be overridden" in message


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"annotations": {"tandem.dev/config-hash": "x"}},
         "spec.router.podTemplate.annotations.tandem.dev/config-hash"),
        ({"labels": {"team": "not ok!"}}, "spec.router.podTemplate.labels.team"),
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "spec.router.podTemplate.volumes[0]"),
        ({"volumeMounts": [{"name": "missing", "mountPath": "/x"}]},
         "spec.router.podTemplate.volumeMounts[0].name"),
        ({"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
         "spec.router.podTemplate.volumeMounts[0].mountPath"),
        ({"volumes": [{"name": "kv-disk", "emptyDir": {}}]}, "spec.router.podTemplate.volumes[0]"),
        ({"volumeMounts": [{"name": "tmp", "mountPath": "/var/lib/tandem/kv-disk"}]},
         "spec.router.podTemplate.volumeMounts[0].mountPath"),
        ({"containers": [{"name": "router", "image": "x"}]},
         "spec.router.podTemplate.containers[0]"),
        ({"containers": [{"name": "a"}]}, "spec.router.podTemplate.containers[0].image"),
        ({"initContainers": [SIDECAR], "containers": [SIDECAR]},
         "spec.router.podTemplate.containers[0]"),
        ({"capabilities": ["SYS_ADMIN"]}, "spec.router.podTemplate.capabilities[0]"),
        ({"securityOverrides": {"capabilities": ["IPC_LOCK"]}},
         "spec.router.podTemplate.securityOverrides.capabilities[0]"),
    ],
)  # fmt: skip
def test_clashes_are_refused_naming_the_field(template, field):
    refused(with_template("router", template), field)


@pytest.mark.parametrize(
    ("security", "field", "override"),
    [
        ({"runAsUser": 0}, "runAsUser", {"runAsRoot": True}),
        ({"runAsNonRoot": False}, "runAsNonRoot", {"runAsRoot": True}),
        ({"readOnlyRootFilesystem": False}, "readOnlyRootFilesystem",
         {"writableRootFilesystem": True}),
        ({"privileged": True}, "privileged", {"privileged": True}),
        ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation",
         {"allowPrivilegeEscalation": True}),
        ({"seccompProfile": {"type": "Unconfined"}}, "seccompProfile", {"unconfinedSeccomp": True}),
        ({"capabilities": {"add": ["NET_ADMIN"]}}, "capabilities.add[0]",
         {"capabilities": ["NET_ADMIN"]}),
        ({"capabilities": {"add": ["NET_RAW"]}}, "capabilities.add[0]",
         {"capabilities": ["NET_RAW"]}),
    ],
)  # fmt: skip
def test_a_sidecar_weakening_needs_its_override(security, field, override):
    sidecar = SIDECAR | {"securityContext": security}
    at = "spec.decode.podTemplate.containers[0].securityContext"
    message = refused(with_template("decode", {"containers": [sidecar]}), f"{at}.{field}")
    assert "securityOverrides" in message
    allowed = with_template("decode", {"containers": [sidecar], "securityOverrides": override})
    context = pod(allowed, "decode")["spec"]["containers"][1]["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]


def test_a_sidecar_keeps_its_safe_choices_and_the_defaults_fill_the_rest():
    sidecar = SIDECAR | {"securityContext": {"runAsUser": 1337, "capabilities": {
        "add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}}  # fmt: skip
    context = pod(with_template("router", {"containers": [sidecar]}), "router")["spec"][
        "containers"][1]["securityContext"]  # fmt: skip
    assert context == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}, "runAsUser": 1337,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("security", "field"),
    [
        ({"capabilities": {"drop": ["NET_RAW"]}}, "capabilities.drop"),
        ({"seLinuxOptions": {"type": "spc_t"}}, "seLinuxOptions"),
    ],
)
def test_what_the_operator_cannot_judge_is_refused(security, field):
    sidecar = SIDECAR | {"securityContext": security}
    refused(with_template("prefill", {"initContainers": [sidecar]}),
            f"spec.prefill.podTemplate.initContainers[0].securityContext.{field}")  # fmt: skip


def test_a_host_path_volume_needs_its_override():
    volume = {"name": "dev", "hostPath": {"path": "/dev/infiniband"}}
    refused(with_template("decode", {"volumes": [volume]}), "spec.decode.podTemplate.volumes[0]")
    allowed = with_template("decode", {"volumes": [volume],
                                       "securityOverrides": {"hostPathVolumes": True}})  # fmt: skip
    assert volume in pod(allowed, "decode")["spec"]["volumes"]


def test_overrides_apply_to_the_role_container_only():
    overrides = {"runAsRoot": True, "writableRootFilesystem": True, "privileged": True,
                 "unconfinedSeccomp": True, "capabilities": ["SYS_ADMIN"]}  # fmt: skip
    llmd = with_template("decode", {"securityOverrides": overrides, "capabilities": ["IPC_LOCK"]})
    decode = pod(llmd, "decode")["spec"]
    assert decode["containers"][0]["securityContext"] == {
        "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
        "allowPrivilegeEscalation": True, "readOnlyRootFilesystem": False, "privileged": True,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_ADMIN"]},
        "seccompProfile": {"type": "Unconfined"},
    }  # fmt: skip
    assert decode["securityContext"]["runAsNonRoot"] is True  # the pod's default stays
    router = pod(llmd, "router")["spec"]["containers"][0]["securityContext"]
    assert router["runAsNonRoot"] is True and "privileged" not in router


def test_the_spec_reports_what_is_relaxed_per_role():
    llmd = with_template("decode", {"securityOverrides": {"privileged": True,
                                    "capabilities": ["SYS_ADMIN", "CAP_NET_ADMIN"]}})  # fmt: skip
    writable = {"writableRootFilesystem": True}
    llmd["spec"]["router"] = {"podTemplate": {"securityOverrides": writable}}
    assert parse(llmd).relaxed() == (
        "router: writableRootFilesystem",
        "decode: privileged, capabilities SYS_ADMIN NET_ADMIN",
    )
    assert parse(with_template("decode", {"capabilities": ["IPC_LOCK"]})).relaxed() == ()


def test_the_crd_takes_only_safe_capabilities_outside_the_overrides():
    assert validate(with_template("decode", {"capabilities": ["IPC_LOCK"]})) == []
    errors = validate(with_template("decode", {"capabilities": ["SYS_ADMIN"]}))
    assert any("spec.decode.podTemplate.capabilities" in e for e in errors), errors
    mount = {"name": "x", "mountPath": "/x", "mountPropagation": "Bidirectional"}
    errors = validate(with_template("decode", {"volumeMounts": [mount]}))
    assert any("mountPropagation" in e for e in errors), errors
