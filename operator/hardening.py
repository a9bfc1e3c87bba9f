"""The hardened defaults every pod starts from, and what counts as weakening them.

Every container runs as uid 1000 (non-root), on a read-only root filesystem, without
privilege escalation, with all capabilities dropped, under the runtime's default seccomp
profile. A role's `podTemplate` may add the capabilities in SAFE_CAPABILITIES freely; any
other relaxation must be named in `podTemplate.securityOverrides`, which applies it to the
role's own container, permits the same in the role's sidecars and init containers, and is
reported in the resource's `HardeningRelaxed` condition.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from tandem.operator.reader import Reader

RUN_AS = 1000
# Adding these does not weaken isolation. IPC_LOCK lets a process pin memory (RDMA and NIXL
# register their KV buffers), and pinned memory is still charged to the pod's memory limit;
# NET_BIND_SERVICE binds ports below 1024 (Pod Security "restricted" allows it). Anything
# else (NET_RAW, which lets a pod spoof traffic on the pod network, SYS_ADMIN, NET_ADMIN,
# SYS_PTRACE, ...) is a weakening.
SAFE_CAPABILITIES = ("IPC_LOCK", "NET_BIND_SERVICE")
# securityContext keys a sidecar may set; the operator cannot judge the others.
CONTAINER_SECURITY_KEYS = (
    "runAsNonRoot", "runAsUser", "runAsGroup", "readOnlyRootFilesystem",
    "allowPrivilegeEscalation", "privileged", "capabilities", "seccompProfile",
)  # fmt: skip


@dataclass(frozen=True)
class SecurityOverrides:
    """`podTemplate.securityOverrides`: each field relaxes one hardened default."""

    run_as_root: bool = False
    writable_root_filesystem: bool = False
    allow_privilege_escalation: bool = False
    privileged: bool = False
    unconfined_seccomp: bool = False
    host_path_volumes: bool = False
    capabilities: tuple[str, ...] = ()

    def relaxed(self) -> list[str]:
        """What is relaxed, in the CRD's words (`privileged`, `capabilities SYS_ADMIN`)."""
        flags = [_camel(f.name) for f in fields(self) if getattr(self, f.name) is True]
        if self.capabilities:
            flags.append(f"capabilities {' '.join(self.capabilities)}")
        return flags


OVERRIDE_FLAGS = tuple(f.name for f in fields(SecurityOverrides) if f.default is False)


def read_security_overrides(overrides: Reader) -> SecurityOverrides:
    """Read `podTemplate.securityOverrides`. Raises ValueError naming the field."""
    capabilities = overrides.sequence("capabilities")
    for index, name in enumerate(capabilities):
        named = isinstance(name, str) and re.fullmatch(r"(CAP_)?[A-Z_]+", name)
        if not named or capability(name) in SAFE_CAPABILITIES:
            raise overrides.error(
                f"must name a capability beyond {', '.join(SAFE_CAPABILITIES)} (add those "
                f"with the pod template's capabilities), got {name!r}", f"capabilities[{index}]"
            )  # fmt: skip
    flags = {flag: overrides.boolean(_camel(flag), default=False) for flag in OVERRIDE_FLAGS}
    names = tuple(dict.fromkeys(capability(c) for c in capabilities))
    return SecurityOverrides(**flags, capabilities=names)


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(
    add: Sequence[str] = (), overrides: SecurityOverrides | None = None
) -> dict[str, Any]:
    """A role's own container: the hardened defaults, plus `add`ed capabilities, with the
    relaxations `overrides` names applied."""
    relax = overrides or SecurityOverrides()
    context: dict[str, Any] = {
        "runAsNonRoot": not relax.run_as_root,
        **({"runAsUser": 0, "runAsGroup": 0} if relax.run_as_root else {}),
        "allowPrivilegeEscalation": relax.allow_privilege_escalation or relax.privileged,
        "readOnlyRootFilesystem": not relax.writable_root_filesystem,
        **({"privileged": True} if relax.privileged else {}),
        "capabilities": {"drop": ["ALL"]},
    }
    if added := list(dict.fromkeys([*add, *relax.capabilities])):
        context["capabilities"]["add"] = added
    if relax.unconfined_seccomp:
        context["seccompProfile"] = {"type": "Unconfined"}
    return context


def harden(security: Reader, allowed: SecurityOverrides, allowed_at: str) -> dict[str, Any]:
    """A sidecar's or init container's `securityContext` merged over the hardened defaults.
    Raises ValueError naming the field that weakens them without an override allowing it
    (`allowed`, read at the path `allowed_at`)."""
    for key in security.data:
        if key not in CONTAINER_SECURITY_KEYS:
            raise security.error(f"only {', '.join(CONTAINER_SECURITY_KEYS)} may be set", key)
    merged = container_security_context() | {
        k: v for k, v in security.data.items() if k != "capabilities"
    }
    if security.data.get("runAsUser") == 0 and "runAsNonRoot" not in security.data:
        merged["runAsNonRoot"] = False  # uid 0 is asked for: say so, or the kubelet refuses
    if merged.get("privileged") and "allowPrivilegeEscalation" not in security.data:
        merged["allowPrivilegeEscalation"] = True  # the API refuses privileged without it
    merged["capabilities"] = _capabilities(security.child("capabilities"), allowed, allowed_at)
    for key, flag in weakenings(merged).items():
        if not getattr(allowed, flag):
            message = f"weakens the hardened defaults: allow it with {allowed_at}.{_camel(flag)}"
            raise security.error(message, key)
    return merged


def weakenings(security: dict[str, Any]) -> dict[str, str]:
    """securityContext key -> the SecurityOverrides flag it needs (capabilities apart)."""
    found = {}
    if security.get("runAsNonRoot") is False or security.get("runAsUser") == 0:
        found["runAsUser" if security.get("runAsUser") == 0 else "runAsNonRoot"] = "run_as_root"
    if security.get("readOnlyRootFilesystem") is False:
        found["readOnlyRootFilesystem"] = "writable_root_filesystem"
    if security.get("privileged"):
        found["privileged"] = "privileged"
    elif security.get("allowPrivilegeEscalation"):
        found["allowPrivilegeEscalation"] = "allow_privilege_escalation"
    if (security.get("seccompProfile") or {}).get("type") == "Unconfined":
        found["seccompProfile"] = "unconfined_seccomp"
    return found


def capability(name: str) -> str:
    """The kernel's name without its `CAP_` prefix, as Kubernetes accepts either."""
    return name.removeprefix("CAP_")


def _capabilities(
    capabilities: Reader, allowed: SecurityOverrides, allowed_at: str
) -> dict[str, Any]:
    drop = capabilities.sequence("drop")
    if drop and "ALL" not in drop:
        raise capabilities.error("must include ALL (add what the container needs)", "drop")
    add = capabilities.sequence("add")
    for index, name in enumerate(add):
        if capability(str(name)) not in (*SAFE_CAPABILITIES, *allowed.capabilities):
            raise capabilities.error(
                f"{name} weakens the hardened defaults: allow it with "
                f"{allowed_at}.capabilities", f"add[{index}]"
            )  # fmt: skip
    return {"drop": ["ALL"], **({"add": list(add)} if add else {})}


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.title() for word in rest)
