"""A real node for the e2e suite, beside the control plane: containerd with its CRI plugin,
runc and the CNI plugins from Debian's packages, and the kubelet, kube-scheduler and
kube-proxy from $TANDEM_KUBE_BIN. Pods really run, on a bridge of the suite's own
(`tandem0`, 10.244.0.0/24) that the API server also listens on.

The host is handed back as it was found: the sysctls the kubelet and kube-proxy rewrite,
the iptables rules they add, the bridge and its route, the pods' containers and network
namespaces. containerd keeps its images under $TANDEM_E2E_STATE (default
/var/lib/tandem-e2e), so an image is imported once, not every run.

What this needs of the machine (a Debian 12 VM as root, cgroup v1 hybrid, no registry):
`restrict_oom_score_adj` (root lacks CAP_SYS_RESOURCE), a kubelet with `failCgroupV1: false`,
`cgroupDriver: cgroupfs` and `oomScoreAdj: 0`, and images built locally (image/local-base.sh)
and imported with `ctr images import`. The binaries are built outside the project.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.disagg.nodes import free_port, wait_until
from tests.operator.e2e.control_plane import SERVICE_RANGE, ControlPlane, spawn, terminate

NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
IPTABLES = ("iptables", "ip6tables")
HOST_TOOLS = ("containerd", "runc", "ctr", "ip", "buildah", *IPTABLES,
              *(f"{f}-save" for f in IPTABLES))  # fmt: skip
NODE_NAME = "e2e-node"
BRIDGE, NODE_IP, POD_CIDR = "tandem0", "10.244.0.1", "10.244.0.0/24"
PAUSE_IMAGE = "localhost/pause:3.10"
CNI_BIN = Path(os.environ.get("TANDEM_CNI_BIN", "/usr/lib/cni"))
STATE = Path(os.environ.get("TANDEM_E2E_STATE", "/var/lib/tandem-e2e"))
# what the kubelet and kube-proxy rewrite on the host, put back on teardown
SYSCTLS = (
    "vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops",
    "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
)  # fmt: skip


def missing(bin_dir: Path | None) -> str | None:
    """Why no node can run here, or None when everything it needs is present."""
    if os.geteuid() != 0:
        return "a node needs root (network namespaces, mounts, cgroups)"
    if bin_dir is None:
        return "no control plane ($TANDEM_KUBE_BIN)"
    absent = [b for b in NODE_BINARIES if not (bin_dir / b).is_file()]
    absent += [t for t in HOST_TOOLS if shutil.which(t) is None]
    absent += [p for p in ("bridge", "host-local", "portmap") if not (CNI_BIN / p).is_file()]
    if not absent and _run("buildah", "inspect", PAUSE_IMAGE, check=False).returncode:
        return f"no {PAUSE_IMAGE} in buildah's storage: run image/local-base.sh"
    if absent:
        return (
            f"no {', '.join(absent)}: the kubelet, kube-scheduler and kube-proxy come from "
            "$TANDEM_KUBE_BIN; containerd, runc, iptables and the CNI plugins from Debian"
        )
    return None


class HostNetwork:
    """The bridge the pods hang off (and the API server listens on), the service range
    routed to it, and a snapshot of the sysctls and iptables rules to restore."""

    def __init__(self) -> None:
        self.sysctls: dict[str, str] = {}
        self.rules: dict[str, str] = {}  # iptables-save's dump, for IPv4 and IPv6

    def start(self) -> HostNetwork:
        for key in SYSCTLS:
            path = Path("/proc/sys") / key
            if path.exists():
                self.sysctls[key] = path.read_text().strip()
        self.rules = {family: _run(f"{family}-save").stdout for family in IPTABLES}
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=False)
        _run("ip", "addr", "replace", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # ClusterIPs never leave the machine: kube-proxy DNATs them to pods on the bridge
        _run("ip", "route", "replace", SERVICE_RANGE, "dev", BRIDGE)
        for key, value in (
            ("net/ipv4/ip_forward", "1"),
            ("net/bridge/bridge-nf-call-iptables", "1"),
        ):
            _write_sysctl(key, value)
        return self

    def stop(self) -> None:
        _run("ip", "route", "del", SERVICE_RANGE, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        for family, dump in self.rules.items():
            _restore_rules(family, dump)
        for key, value in self.sysctls.items():
            _write_sysctl(key, value)


class Node:
    """containerd, the kubelet, the scheduler and kube-proxy, registered as `e2e-node`."""

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane, self.dir = plane, workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.socket = workdir / "containerd.sock"

    def start(self) -> Node:
        self._start_containerd()
        self._spawn("kubelet", self._kubelet_args())
        self._spawn("kube-scheduler", self._scheduler_args())
        self._spawn("kube-proxy", self._proxy_args())
        return self

    def ctr(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """`ctr` in the CRI's namespace on this node's containerd."""
        return _run("ctr", "--address", str(self.socket), "-n", "k8s.io", *args, check=check, **kw)

    def has_image(self, ref: str) -> bool:
        return ref in self.ctr("images", "ls", "-q").stdout.split()

    def load_image(self, ref: str) -> str | None:
        """Make `ref` runnable on this node: imported from buildah's storage (where `make
        image` puts it) unless containerd already holds that very build. None once it is
        here, else why it cannot be."""
        built = None
        if shutil.which("buildah"):
            found = _run("buildah", "inspect", "--type", "image", "--format",
                         "{{.FromImageID}}", ref, check=False)  # fmt: skip
            built = found.stdout.strip() if found.returncode == 0 else None
        marker = STATE / "images" / hashlib.sha256(ref.encode()).hexdigest()[:16]
        if self.has_image(ref) and (built is None or _read(marker) == built):
            return None
        if built is None:
            return f"no image {ref}: build it with `make e2e-image` (buildah)"
        marker.parent.mkdir(parents=True, exist_ok=True)
        archive = marker.with_suffix(".tar")
        try:
            _run("buildah", "push", "-q", ref, f"oci-archive:{archive}:{ref}")
            self.ctr("images", "import", str(archive))
        finally:
            archive.unlink(missing_ok=True)
        marker.write_text(built)
        return None

    def stop(self) -> None:
        """The kubelet last among the Kubernetes parts (so it tears the pods' networks down
        through CNI), then whatever containers are left, then containerd."""
        for name in ("kube-proxy", "kube-scheduler", "kubelet"):
            self._stop(name)
        if "containerd" in self.procs:
            self._remove_containers()
            self._stop("containerd")
        for netns in Path("/run/netns").glob("cni-*"):
            _run("ip", "netns", "delete", netns.name, check=False)
        _unmount_under(self.dir)

    def _start_containerd(self) -> None:
        config = self.dir / "containerd.toml"
        config.write_text(_containerd_config(self.dir, self.socket))
        (self.dir / "cni").mkdir(exist_ok=True)
        (self.dir / "cni" / "10-tandem.conflist").write_text(json.dumps(_cni_config(self.dir)))
        self._spawn("containerd", ["--config", str(config)])
        assert wait_until(lambda: self.ctr("version", check=False).returncode == 0, timeout=60)
        self._remove_containers()  # a run that died leaves its containers in the metadata
        why = self.load_image(PAUSE_IMAGE)
        assert why is None, why

    def _remove_containers(self) -> None:
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            self.ctr("tasks", "delete", "-f", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    def _kubelet_args(self) -> list[str]:
        config = self.dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(_kubelet_config(self.plane, self.socket)))
        return [
            f"--config={config}", f"--kubeconfig={self.plane.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.dir / 'kubelet'}", f"--cert-dir={self.dir / 'kubelet-pki'}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", "--v=1",
        ]  # fmt: skip

    def _scheduler_args(self) -> list[str]:
        config = self.plane.dir / "scheduler.kubeconfig"
        return [
            f"--kubeconfig={config}", f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--leader-elect=false",
        ]  # fmt: skip

    def _proxy_args(self) -> list[str]:
        config = self.dir / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(_proxy_config(self.plane)))
        return [f"--config={config}", "--v=1"]

    def _spawn(self, name: str, args: list[str]) -> None:
        binary = shutil.which(name) if name == "containerd" else str(self.plane.bin / name)
        self.procs[name] = spawn([binary, *args], self.dir / f"{name}.log")

    def _stop(self, name: str) -> None:
        terminate(self.procs.pop(name, None), timeout=30)


def _containerd_config(workdir: Path, socket: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{STATE / "containerd"}"
state = "{workdir / "containerd-state"}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{workdir / "cni"}"
"""


def _cni_config(workdir: Path) -> dict:
    ipam = {
        "type": "host-local", "dataDir": str(workdir / "cni-ipam"),
        "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]], "routes": [{"dst": "0.0.0.0/0"}],
    }  # fmt: skip
    bridge = {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
              "hairpinMode": True, "ipam": ipam}  # fmt: skip
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return {"cniVersion": "1.0.0", "name": "tandem-e2e", "plugins": [bridge, portmap]}


def _kubelet_config(plane: ControlPlane, socket: Path) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": free_port(), "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(plane.ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "oomScoreAdj": 0,
        "failSwapOn": False, "resolvConf": "/etc/resolv.conf", "clusterDomain": "cluster.local",
        "serializeImagePulls": False, "maxPods": 40,
        # never collect the suite's imported images (nothing can pull them back)
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
    }  # fmt: skip


def _proxy_config(plane: ControlPlane) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(plane.dir / "kube-proxy.kubeconfig")},
        "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
        "bindAddress": "127.0.0.1", "oomScoreAdj": 0,
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        # zeros leave the host's conntrack sysctls alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
        "nodePortAddresses": [f"{NODE_IP}/32"],
    }  # fmt: skip


def _restore_rules(family: str, dump: str) -> None:
    """The tables as they were; a table the dump lacks (mangle, once the kubelet made its
    canary chains there) is emptied."""
    subprocess.run([f"{family}-restore"], input=dump, text=True, check=False)
    before = set(re.findall(r"^\*(\w+)", dump, re.M))
    now = set(re.findall(r"^\*(\w+)", _run(f"{family}-save").stdout, re.M))
    for table in now - before:
        _run(family, "-t", table, "-F", check=False)
        _run(family, "-t", table, "-X", check=False)


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / key).write_text(value)


def _unmount_under(root: Path) -> None:
    """Whatever the kubelet left mounted under its folder (secrets, emptyDirs), deepest
    first, so the test's temporary folder can go."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(str(root))), reverse=True):
        _run("umount", "-l", point, check=False)


def _run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, **kw)
