"""Pod Security "restricted" admits every pod the operator renders (Deployments and the
model cache's Job) unless the spec's podTemplate asks for more, and then the checker names
exactly what was asked for."""

from __future__ import annotations

import copy

import pytest

from tandem.operator.render import render
from tests.operator.crd_schema import example
from tests.operator.pod_security import restricted_violations


def pods(llmd):
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["spec"]
        for o in render(llmd) if o["kind"] in ("Deployment", "Job")
    }  # fmt: skip


def without_pod_templates(llmd):
    llmd = copy.deepcopy(llmd)
    for role in ("router", "prefill", "decode"):
        llmd["spec"].get(role, {}).pop("podTemplate", None)
    return llmd


@pytest.mark.parametrize("name", ["minimal", "full", "kv-tiers"])
def test_pods_without_a_pod_template_are_restricted(name):
    found = pods(without_pod_templates(example(name)))
    assert len(found) >= 3
    assert {key: restricted_violations(pod) for key, pod in found.items()} == {
        key: [] for key in found
    }


def test_hugging_face_without_a_cache_is_restricted_too():
    llmd = without_pod_templates(example("full"))
    del llmd["spec"]["model"]["cache"]
    for pod in pods(llmd).values():
        assert pod.get("initContainers") and restricted_violations(pod) == []


def test_the_full_example_leaves_restricted_only_for_ipc_lock():
    """IPC_LOCK keeps the operator's hardening but not Pod Security's levels: the prefill
    and decode pods need the privileged level (docs/kubernetes.md)."""
    found = {key: restricted_violations(pod) for key, pod in pods(example("full")).items()}
    (job,) = [key for key in found if key.startswith("Job/")]
    assert found.pop(job) == []
    ipc_lock = ["containers[0].securityContext.capabilities.add: IPC_LOCK (baseline)"]
    assert found == {
        "Deployment/qwen-router": [],
        "Deployment/qwen-prefill": ipc_lock,
        "Deployment/qwen-decode": ipc_lock,
    }


@pytest.mark.parametrize(
    ("overrides", "violation"),
    [
        ({"runAsRoot": True}, "runAsUser: 0"),
        ({"privileged": True}, "privileged: privileged"),
        ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation: must be false"),
        ({"unconfinedSeccomp": True}, "seccompProfile: Unconfined"),
        ({"capabilities": ["SYS_ADMIN"]}, "capabilities.add: SYS_ADMIN (baseline)"),
    ],
)
def test_each_security_override_is_a_violation_the_checker_sees(overrides, violation):
    llmd = example("minimal")
    llmd["spec"]["decode"] = {"podTemplate": {"securityOverrides": overrides}}
    decode = pods(llmd)["Deployment/llama-decode"]
    assert f"containers[0].securityContext.{violation}" in restricted_violations(decode)
    router = pods(llmd)["Deployment/llama-router"]
    assert restricted_violations(router) == []


def test_a_writable_root_filesystem_is_restricted_but_reported():
    """Pod Security does not forbid it; the operator's hardening does (HardeningRelaxed)."""
    llmd = example("minimal")
    overrides = {"writableRootFilesystem": True}
    llmd["spec"]["decode"] = {"podTemplate": {"securityOverrides": overrides}}
    decode = pods(llmd)["Deployment/llama-decode"]
    assert decode["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert restricted_violations(decode) == []
