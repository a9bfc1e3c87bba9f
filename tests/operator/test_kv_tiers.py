"""`spec.<pool>.kvTiers`: the engine's flags, the memory and storage the tiers add, the disk
tier's volume, what is refused (by the CRD, by the operator, and then in SpecValid and an
Event), and that tiers roll their pool without changing the revision."""

from __future__ import annotations

import argparse
import copy
import importlib
import json

import pytest

from tandem.cli import apply_config
from tandem.operator.names import KV_DISK_DIR, REVISION_LABEL
from tandem.operator.quantity import format_bytes, format_gib, parse_bytes
from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tests.operator.crd_schema import example, validate
from tests.operator.fake_api import FakeApi

MEMORY = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
CLAIM = {"ephemeral": {"volumeClaimTemplate": {"spec": {
    "accessModes": ["ReadWriteOnce"], "storageClassName": "local-nvme",
    "resources": {"requests": {"storage": "210Gi"}}}}}}  # fmt: skip


def with_tiers(tiers: dict, role: str = "decode", resources: dict | None = None) -> dict:
    llmd = example("minimal")
    pool = llmd["spec"].setdefault(role, {})
    pool["kvTiers"] = copy.deepcopy(tiers)
    if resources is not None:
        pool["resources"] = copy.deepcopy(resources)
    return llmd


def pod(llmd: dict, role: str = "decode") -> dict:
    (deployment,) = [o for o in render(llmd) if o["kind"] == "Deployment"
                     and o["metadata"]["name"].endswith(f"-{role}")]  # fmt: skip
    return deployment["spec"]["template"]


def container(llmd: dict, role: str = "decode") -> dict:
    return pod(llmd, role)["spec"]["containers"][0]


def tier_args(llmd: dict, role: str = "decode") -> list[str]:
    return container(llmd, role)["args"][3:]  # after `<role> --config FILE`


def volume(llmd: dict, name: str = "kv-disk") -> dict | None:
    return next((v for v in pod(llmd)["spec"]["volumes"] if v["name"] == name), None)


@pytest.mark.parametrize(
    ("quantity", "num_bytes", "gib", "written"),
    [("8Gi", 8 * 2**30, "8", "8Gi"), ("0.5Gi", 2**29, "0.5", "512Mi"),
     ("10G", 10**10, "9.31322574615478515625", "9765625Ki"),
     ("1e3", 1000, "0.000000931322574615478515625", "1000"),
     ("100m", 1, "0.000000000931322574615478515625", "1")],  # rounded up to a whole byte
)  # fmt: skip
def test_quantities_of_bytes(quantity, num_bytes, gib, written):
    assert parse_bytes(quantity) == num_bytes
    assert (format_gib(num_bytes), format_bytes(num_bytes)) == (gib, written)


def test_a_host_tier_adds_its_flag_and_its_memory():
    llmd = with_tiers({"host": {"size": "8Gi"}}, resources=MEMORY)
    assert tier_args(llmd) == ["--kv-host-gib", "8"]
    resources = container(llmd)["resources"]
    assert resources["requests"] == {"cpu": "8", "memory": "72Gi"}
    assert resources["limits"] == {"memory": "72Gi", "nvidia.com/gpu": 1}
    assert volume(llmd) is None
    assert KV_DISK_DIR not in {m["mountPath"] for m in container(llmd)["volumeMounts"]}
    assert tier_args(llmd, "prefill") == []  # the other pool has none


def test_without_memory_set_the_host_tier_is_requested_not_limited():
    llmd = with_tiers({"host": {"size": "0.5Gi"}})
    assert tier_args(llmd) == ["--kv-host-gib", "0.5"]
    resources = container(llmd)["resources"]
    assert resources["requests"] == {"memory": "512Mi"}
    assert "memory" not in resources["limits"]


def test_a_memory_limit_alone_grows_and_kubernetes_copies_it_into_the_request():
    llmd = with_tiers({"host": {"size": "8Gi"}}, resources={"limits": {"memory": "10G"}})
    resources = container(llmd)["resources"]
    assert resources["limits"]["memory"] == format_bytes(10**10 + 8 * 2**30)
    assert "requests" not in resources


def test_a_disk_tier_defaults_to_a_writable_empty_dir_of_its_size():
    resources = {"requests": {"ephemeral-storage": "10Gi"}, "limits": {"ephemeral-storage": "20Gi"}}
    llmd = with_tiers({"host": {"size": "1Gi"}, "disk": {"size": "100Gi"}}, resources=resources)
    assert tier_args(llmd) == [
        "--kv-host-gib", "1", "--kv-disk-gib", "100", "--kv-disk-dir", KV_DISK_DIR
    ]  # fmt: skip
    assert volume(llmd) == {"name": "kv-disk", "emptyDir": {"sizeLimit": "100Gi"}}
    (mount,) = [m for m in container(llmd)["volumeMounts"] if m["name"] == "kv-disk"]
    assert mount == {"name": "kv-disk", "mountPath": KV_DISK_DIR}  # not readOnly
    assert container(llmd)["securityContext"]["readOnlyRootFilesystem"] is True
    limits = container(llmd)["resources"]
    # no memory given: the host tier's alone is requested
    assert limits["requests"] == {"ephemeral-storage": "110Gi", "memory": "1Gi"}
    assert limits["limits"]["ephemeral-storage"] == "120Gi"


def test_a_disk_tier_on_the_users_volume_and_a_host_tier():
    llmd = with_tiers({"host": {"size": "16Gi"}, "disk": {"size": "200Gi", "volume": CLAIM}},
                      resources=MEMORY)  # fmt: skip
    assert tier_args(llmd) == [
        "--kv-host-gib", "16", "--kv-disk-gib", "200", "--kv-disk-dir", KV_DISK_DIR
    ]  # fmt: skip
    assert volume(llmd) == {"name": "kv-disk", **CLAIM}
    resources = container(llmd)["resources"]
    assert resources["requests"] == {"cpu": "8", "memory": "80Gi"}  # no ephemeral-storage


def test_a_users_host_path_needs_the_pools_override():
    tiers = {
        "host": {"size": "1Gi"},
        "disk": {"size": "1Ti", "volume": {"hostPath": {"path": "/mnt/nvme"}}},
    }
    with pytest.raises(ValueError, match=r"spec\.decode\.podTemplate\.securityOverrides"):
        render(with_tiers(tiers))
    llmd = with_tiers(tiers)
    llmd["spec"]["decode"]["podTemplate"] = {"securityOverrides": {"hostPathVolumes": True}}
    assert volume(llmd) == {"name": "kv-disk", "hostPath": {"path": "/mnt/nvme"}}
    assert "ephemeral-storage" not in container(llmd)["resources"].get("requests", {})


@pytest.mark.parametrize(
    "tiers", [{}, {"host": {"size": "0"}}, {"host": {"size": "0Gi"}, "disk": {"size": "0"}}]
)
def test_no_tiers_leave_the_pods_as_they_were(tiers):
    assert render(with_tiers(tiers)) == render(example("minimal"))


def test_tiers_roll_their_pool_alone_and_keep_the_revision():
    """A pod with or without lower tiers holds and ships the same KV blocks: the revision,
    which pairs prefill with decode, stays; the pool's template changes, so it rolls."""
    before = {(o["kind"], o["metadata"]["name"]): o for o in render(example("full"))}
    llmd = example("full")
    llmd["spec"]["decode"]["kvTiers"] = {"host": {"size": "32Gi"}}
    after = {(o["kind"], o["metadata"]["name"]): o for o in render(llmd)}
    changed = sorted(key for key in before if before[key] != after[key])
    assert changed == [("Deployment", "qwen-decode")]
    templates = [d[("Deployment", "qwen-decode")]["spec"]["template"] for d in (before, after)]
    assert templates[0] != templates[1]
    labels = [t["metadata"]["labels"][REVISION_LABEL] for t in templates]
    assert labels[0] == labels[1]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_flags_are_the_real_commands(role, tmp_path):
    """Once the node commands take the tiers' flags, they read these as meant."""
    parser = argparse.ArgumentParser()
    importlib.import_module(f"tandem.{role}_node.cli").add_arguments(parser)
    if "--kv-host-gib" not in parser._option_string_actions:
        pytest.skip(f"tandem {role} has no --kv-host-gib yet")
    llmd = with_tiers({"host": {"size": "512Mi"}, "disk": {"size": "2Gi"}}, role)
    config = next(o for o in render(llmd) if o["kind"] == "ConfigMap")["data"][f"{role}.json"]
    (tmp_path / "flags.json").write_text(config)
    apply_config(parser, str(tmp_path / "flags.json"))
    args = parser.parse_args(tier_args(llmd, role))
    assert (args.kv_host_gib, args.kv_disk_gib, args.kv_disk_dir) == (0.5, 2.0, KV_DISK_DIR)


@pytest.mark.parametrize(
    ("tiers", "resources", "operator_error", "crd_error"),
    [
        ({"host": {"size": "lots"}}, None, "spec.decode.kvTiers.host.size: must match",
         "spec.decode.kvTiers.host.size"),
        ({"host": {"size": "-8Gi"}}, None, "spec.decode.kvTiers.host.size: must match",
         "spec.decode.kvTiers.host.size"),
        ({"disk": {}}, None, "spec.decode.kvTiers.disk.size: is required",
         "'size' is a required"),
        ({"disk": {"size": "1Ti"}}, None, "spec.decode.kvTiers.disk: the disk tier sits under",
         None),
        ({"disk": {"size": "1Ti", "volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}},
         None, "spec.decode.kvTiers.disk.volume: must be one volume source",
         "spec.decode.kvTiers.disk.volume"),
        ({"host": {"size": "8Gi"}}, {"requests": {"memory": "8 GB"}},
         "spec.decode.resources.requests.memory: must be a quantity",
         "spec.decode.resources.requests.memory"),
    ],
)  # fmt: skip
def test_bad_tiers_are_refused_by_the_crd_and_the_operator(
    tiers, resources, operator_error, crd_error
):
    llmd = with_tiers(tiers, resources=resources)
    with pytest.raises(ValueError, match=operator_error.replace(".", r"\.")):
        render(llmd)
    errors = validate(llmd)
    if crd_error is None:  # a rule across fields: the operator's alone (SpecValid False)
        assert errors == []
    else:
        assert any(crd_error in e for e in errors), errors


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ({"persistentVolumeClaim": {"claimName": "kv"}}, "every pod of the pool"),
        ({"configMap": {"name": "kv"}}, "read-only"),
        ({"emptyDir": {"medium": "Memory"}}, "host memory"),
    ],
)
def test_volumes_that_cannot_hold_the_disk_tier_are_refused(source, reason):
    (kind,) = source
    llmd = with_tiers({"disk": {"size": "1Ti", "volume": source}})
    assert validate(llmd) == []  # the CRD takes any one volume source
    with pytest.raises(
        ValueError, match=rf"spec\.decode\.kvTiers\.disk\.volume\.{kind}: .*{reason}"
    ):
        render(llmd)


def test_the_router_has_no_tiers():
    llmd = example("minimal")
    llmd["spec"]["router"] = {"kvTiers": {"host": {"size": "8Gi"}}}
    assert any("'kvTiers' was unexpected" in e for e in validate(llmd))


def test_a_refused_size_is_reported_and_changes_nothing():
    api, llmd = FakeApi(), with_tiers({"host": {"size": "8Gi"}})
    run = Reconciler(api, now=lambda: "2026-11-21T10:00:00Z")
    run.reconcile(llmd)
    stored = copy.deepcopy(api.objects)
    llmd["spec"]["decode"]["kvTiers"]["host"]["size"] = "8GB"
    outcome = run.reconcile(llmd)
    assert outcome.spec_error.startswith("spec.decode.kvTiers.host.size: must match")
    assert outcome.applied == [] and api.objects == stored
    assert api.warnings == [("Warning", "InvalidSpec", outcome.spec_error)]
    status = api.statuses[-1]
    spec_valid = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert (status["phase"], spec_valid["status"]) == ("Invalid", "False")
    assert spec_valid["message"] == outcome.spec_error


def test_the_example_renders_each_pools_tiers():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(example("kv-tiers"))}
    config = json.loads(objects[("ConfigMap", "llama-tiered-config")]["data"]["decode.json"])
    assert not any(flag.startswith("kv-") for flag in config)  # flags are per pool, in args
    for role, memory, disk in (("prefill", "48Gi", "emptyDir"), ("decode", "96Gi", "ephemeral")):
        spec = objects[("Deployment", f"llama-tiered-{role}")]["spec"]["template"]["spec"]
        assert spec["containers"][0]["resources"]["limits"]["memory"] == memory
        (kv_disk,) = [v for v in spec["volumes"] if v["name"] == "kv-disk"]
        assert disk in kv_disk
