"""A real Kubernetes control plane for the e2e tests: etcd, kube-apiserver (RBAC on, pod
security admission) and kube-controller-manager (garbage collector, Deployment and
ReplicaSet controllers) on free ports, from binaries found in $TANDEM_KUBE_BIN. Alone, it
listens on loopback and pods stay Pending; with a node (`node.py`) the API server listens
on the node's bridge address, which pods reach through the `kubernetes` Service.

The binaries are built outside the project; this module only runs them.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import ssl
import subprocess
from pathlib import Path

import httpx
import yaml

from tests.disagg.nodes import free_port, wait_until

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
SERVICE_RANGE = "10.96.0.0/12"
CLIENT_EXT = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
SERVER_EXT = (
    "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,IP:10.244.0.1,"
    "DNS:kubernetes.default.svc\n"
)
# client certificates: file name -> subject (CN the user, O the group)
CLIENTS = {
    "kcm": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
    "kube-proxy": "/CN=system:kube-proxy",
    "kubelet": "/CN=system:node:e2e-node/O=system:nodes",
    "apiserver-kubelet": "/CN=kube-apiserver-kubelet-client/O=system:masters",
}


def kube_bin() -> Path | None:
    """The folder of the control-plane binaries, or None when $TANDEM_KUBE_BIN names none."""
    folder = os.environ.get("TANDEM_KUBE_BIN")
    if not folder or not all((Path(folder) / b).is_file() for b in BINARIES):
        return None
    return Path(folder)


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, client certificates for the controller
    manager, and the service-account signing key pair (openssl, 2048-bit RSA)."""
    pki.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=tandem-e2e-ca")  # fmt: skip
    certs = [("apiserver", "/CN=kube-apiserver", SERVER_EXT)]
    certs += [(name, subject, CLIENT_EXT) for name, subject in CLIENTS.items()]
    for name, subject, ext in certs:
        (pki / f"{name}.ext").write_text(ext)
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", subject)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                "-extfile", f"{name}.ext")  # fmt: skip
    openssl("genrsa", "-out", "sa.key", "2048")
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def kubeconfig(
    path: Path, server: str, ca: Path, token: str | None = None, cert: Path | None = None
) -> Path:
    """A kubeconfig with one context: a bearer token, or a client certificate (and key)."""
    user = {"token": token} if token else {
        "client-certificate-data": _b64(cert), "client-key-data": _b64(cert.with_suffix(".key")),
    }  # fmt: skip
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    """`argv` in the background, its output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def terminate(proc: subprocess.Popen | None, timeout: float = 60) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class ControlPlane:
    """Owns the three processes and their folder; `admin_token` is in group system:masters."""

    def __init__(self, bin_dir: Path, workdir: Path, host: str = "127.0.0.1") -> None:
        self.bin, self.dir, self.host = bin_dir, workdir, host
        self.pki = workdir / "pki"
        self.admin_token = secrets.token_hex(16)
        self.etcd_port, self.peer_port = free_port(), free_port()
        self.api_port, self.kcm_port = free_port(), free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.api_port}"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def start(self) -> ControlPlane:
        make_pki(self.pki)
        (self.pki / "tokens.csv").write_text(
            f"{self.admin_token},e2e-admin,e2e-admin,system:masters\n"
        )
        for name in CLIENTS:
            path = self.dir / f"{name}.kubeconfig"
            kubeconfig(path, self.server, self.ca, cert=self.pki / f"{name}.crt")
        kubeconfig(self.dir / "admin.kubeconfig", self.server, self.ca, token=self.admin_token)
        self._spawn("etcd", self._etcd_args())
        self.start_apiserver()
        self._spawn("kube-controller-manager", self._kcm_args())
        return self

    def start_apiserver(self) -> None:
        self._spawn("kube-apiserver", self._apiserver_args())
        assert wait_until(self.ready, timeout=300), "kube-apiserver never became ready"

    def crash_apiserver(self) -> None:
        """SIGKILL, as a crash or a node loss does (a SIGTERM drains watches for a while)."""
        proc = self.procs.pop("kube-apiserver")
        proc.kill()
        proc.wait()

    def ready(self) -> bool:
        try:
            r = httpx.get(f"{self.server}/readyz", headers=self.admin_headers, verify=self.tls)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    @property
    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def stop(self) -> None:
        """Clients first: an API server with watches open drains them before it exits."""
        for name in reversed(BINARIES):
            self._stop(name)

    def _spawn(self, name: str, args: list[str]) -> None:
        self.procs[name] = spawn([str(self.bin / name), *args], self.dir / f"{name}.log")

    def _stop(self, name: str) -> None:
        terminate(self.procs.pop(name, None))

    def _etcd_args(self) -> list[str]:
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.peer_port}"
        return [
            "--name=e2e", f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=e2e={peer}", "--unsafe-no-fsync=true", "--log-level=warn",
        ]  # fmt: skip

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        return [
            f"--bind-address={self.host}", f"--advertise-address={self.host}",
            f"--secure-port={self.api_port}", f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--token-auth-file={p / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--profiling=false",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]  # fmt: skip

    def _kcm_args(self) -> list[str]:
        p, config = self.pki, self.dir / "kcm.kubeconfig"
        return [
            f"--kubeconfig={config}", f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}", "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--controllers=*",
            "--leader-elect=false",
        ]  # fmt: skip
