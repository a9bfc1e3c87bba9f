"""`spec.<role>.podTemplate`: what a platform adds to one role's pods (labels, annotations,
volumes, sidecars, init containers, scheduling classes, capabilities), read once and
checked against what the operator relies on and against its hardening (hardening.py).

Every refusal names the field: a label the operator sets, a volume or mount path or
container name the pod already has, a mount of a volume the pod lacks, or a weakening of
the hardened defaults that `securityOverrides` does not allow.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from tandem.operator.hardening import (
    SAFE_CAPABILITIES,
    SecurityOverrides,
    harden,
    read_security_overrides,
)
from tandem.operator.names import (
    DOWNLOAD_CONTAINER,
    POD_VOLUMES,
    RESERVED_PREFIX,
    RESERVED_VOLUMES,
    REVISION_LABEL,
    labels,
)
from tandem.operator.reader import Reader

# Kubernetes' syntax for label keys (an optional DNS-subdomain prefix, a name) and values.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}"
LABEL_VALUE = rf"({_NAME})?"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"


@dataclass(frozen=True)
class PodOverrides:
    """Validated additions to one role's pod template; containers are already hardened."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    containers: list[dict[str, Any]] = field(default_factory=list)
    capabilities: tuple[str, ...] = ()
    security: SecurityOverrides = field(default_factory=SecurityOverrides)


def read_pod_overrides(template: Reader, role: str) -> PodOverrides:
    """Read `spec.<role>.podTemplate`. Raises ValueError naming the first refused field."""
    security = read_security_overrides(template.child("securityOverrides"))
    volumes = _volumes(template, security)
    names = {*POD_VOLUMES, *(v["name"] for v in volumes)}
    taken = {role, DOWNLOAD_CONTAINER}
    init_containers = _containers(template, "initContainers", security, names, taken)
    return PodOverrides(
        labels=_labels(template, role),
        annotations=_annotations(template),
        scheduler_name=template.string("schedulerName", pattern=DNS_SUBDOMAIN),
        priority_class_name=template.string("priorityClassName", pattern=DNS_SUBDOMAIN),
        runtime_class_name=template.string("runtimeClassName", pattern=DNS_SUBDOMAIN),
        volumes=volumes,
        volume_mounts=_mounts(template, "volumeMounts", names, set(RESERVED_VOLUMES.values())),
        init_containers=init_containers,
        containers=_containers(template, "containers", security, names, taken),
        capabilities=tuple(_safe_capabilities(template)),
        security=security,
    )


def _labels(template: Reader, role: str) -> dict[str, str]:
    ours = {*labels("x", role), REVISION_LABEL}  # the keys do not depend on the name
    found = _string_map(template, "labels", LABEL_VALUE)
    for key in found:
        if key in ours or key.startswith(RESERVED_PREFIX):
            raise template.error("is set by the operator and cannot be overridden", f"labels.{key}")
    return found


def _annotations(template: Reader) -> dict[str, str]:
    found = _string_map(template, "annotations", None)
    for key in found:
        if key.startswith(RESERVED_PREFIX):
            raise template.error(f"{RESERVED_PREFIX} annotations are the operator's",
                                 f"annotations.{key}")  # fmt: skip
    return found


def _string_map(template: Reader, key: str, value_pattern: str | None) -> dict[str, str]:
    found = template.mapping(key)
    for name, value in found.items():
        if not re.fullmatch(LABEL_KEY, name):
            raise template.error("is not a valid key", f"{key}.{name}")
        if not isinstance(value, str) or (
            value_pattern is not None and not re.fullmatch(value_pattern, value)
        ):
            raise template.error(f"is not a valid value: {value!r}", f"{key}.{name}")
    return dict(found)


def _safe_capabilities(template: Reader) -> list[str]:
    found = template.sequence("capabilities")
    for index, name in enumerate(found):
        if name not in SAFE_CAPABILITIES:
            raise template.error(
                f"must be one of {', '.join(SAFE_CAPABILITIES)} (others weaken the hardening: "
                f"name them in {template.path}.securityOverrides.capabilities), got {name!r}",
                f"capabilities[{index}]",
            )
    return list(dict.fromkeys(found))


def _volumes(template: Reader, security: SecurityOverrides) -> list[dict[str, Any]]:
    volumes = _named_items(template, "volumes", set(RESERVED_VOLUMES))
    for index, volume in enumerate(volumes):
        if "hostPath" in volume and not security.host_path_volumes:
            raise template.error(
                "a hostPath volume weakens the hardened defaults: allow it with "
                f"{template.path}.securityOverrides.hostPathVolumes", f"volumes[{index}]"
            )  # fmt: skip
    return volumes


def _mounts(parent: Reader, key: str, volumes: set[str], paths: set[str]) -> list[dict[str, Any]]:
    mounts = [copy.deepcopy(m) for m in parent.sequence(key)]
    seen = set(paths)
    for index, mount in enumerate(mounts):
        at = Reader(mount if isinstance(mount, dict) else {}, f"{parent.path}.{key}[{index}]")
        name = at.string("name", required=True, min_length=1)
        path = at.string("mountPath", required=True, pattern=r"/.*")
        if name not in volumes:
            raise at.error(f"no volume {name!r} in the pod ({', '.join(sorted(volumes))})", "name")
        if path in seen:
            raise at.error(f"{path} is already mounted in this container", "mountPath")
        seen.add(path)
    return mounts


def _containers(
    template: Reader,
    key: str,
    security: SecurityOverrides,
    volumes: set[str],
    taken: set[str],
) -> list[dict[str, Any]]:
    """Sidecars or init containers, hardened; `taken` collects the pod's container names."""
    containers = _named_items(template, key, taken)
    for index, container in enumerate(containers):
        at = Reader(container, f"{template.path}.{key}[{index}]")
        at.string("image", required=True, min_length=1)
        _mounts(at, "volumeMounts", volumes, set())
        allowed_at = f"{template.path}.securityOverrides"
        container["securityContext"] = harden(at.child("securityContext"), security, allowed_at)
        taken.add(container["name"])
    return containers


def _named_items(parent: Reader, key: str, taken: set[str]) -> list[dict[str, Any]]:
    """Copies of a list of objects with unique names none of which is in `taken`."""
    items = [copy.deepcopy(item) for item in parent.sequence(key)]
    seen = set(taken)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise parent.error("must be an object", f"{key}[{index}]")
        name = Reader(item, f"{parent.path}.{key}[{index}]").string(
            "name", required=True, pattern=r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
        )
        if name in seen:
            raise parent.error(f"the name {name!r} is already used in the pod", f"{key}[{index}]")
        seen.add(name)
    return items
