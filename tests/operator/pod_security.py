"""The Pod Security Standards' "restricted" profile (which contains "baseline"), checked
offline on a pod spec, the way the PodSecurity admission plugin of Kubernetes 1.30 does:
https://kubernetes.io/docs/concepts/security/pod-security-standards/

`restricted_violations(pod_spec)` lists every rule the pod breaks, as `field: why`.
"""

from __future__ import annotations

from typing import Any

# baseline: capabilities the runtime grants by default and a pod may add back
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{kind}[{index}]", container)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for index, container in enumerate(pod.get(kind) or [])
    ]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every restricted (and baseline) rule `pod`, a core/v1 PodSpec, breaks."""
    return _pod_level(pod) + [
        f"{where}.{problem}"
        for where, container in containers(pod)
        for problem in _container_level(container, pod.get("securityContext") or {})
    ]


def _pod_level(pod: dict[str, Any]) -> list[str]:
    found = [f"{key}: host namespace" for key in ("hostNetwork", "hostPID", "hostIPC")
             if pod.get(key)]  # fmt: skip
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volumes.{volume['name']}: {sorted(kinds)} is not a restricted type")
    context = pod.get("securityContext") or {}
    for sysctl in context.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"securityContext.sysctls: {sysctl['name']} is not safe")
    found += [f"securityContext.{p}" for p in _shared_rules(context)]
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append("securityContext.windowsOptions.hostProcess")
    return found


def _container_level(container: dict[str, Any], pod_context: dict[str, Any]) -> list[str]:
    context = container.get("securityContext") or {}
    found = [f"securityContext.{p}" for p in _shared_rules(context)]
    if context.get("privileged"):
        found.append("securityContext.privileged: privileged")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append("securityContext.allowPrivilegeEscalation: must be false")
    if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
        found.append("securityContext.runAsNonRoot: must be true (pod or container)")
    seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        found.append(f"securityContext.seccompProfile: {seccomp} (pod or container)")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append("securityContext.capabilities.drop: must include ALL")
    for name in capabilities.get("add") or []:
        if name.removeprefix("CAP_") not in RESTRICTED_CAPABILITIES:
            level = "baseline" if name not in BASELINE_CAPABILITIES else "restricted"
            found.append(f"securityContext.capabilities.add: {name} ({level})")
    if context.get("procMount", "Default") != "Default":
        found.append("securityContext.procMount: must be Default")
    found += [f"ports: hostPort {p['hostPort']}" for p in container.get("ports") or []
              if p.get("hostPort")]  # fmt: skip
    return found


def _shared_rules(context: dict[str, Any]) -> list[str]:
    """Rules that hold for a pod's and each container's securityContext alike."""
    found = []
    if context.get("runAsUser") == 0:
        found.append("runAsUser: 0")
    if context.get("runAsNonRoot") is False:
        found.append("runAsNonRoot: false")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("seccompProfile: Unconfined")
    if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append("appArmorProfile: Unconfined")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append("seLinuxOptions: not allowed")
    return found
