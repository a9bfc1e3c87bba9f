"""The `tandem operator` process as a kubelet sees it, on a real API server: leader election
between two replicas, an API server restart, credentials refused or revoked, SIGTERM.

Bounds are generous and only trip on a hang; the times these take are in
docs/kubernetes.md, measured, never asserted.
"""

from __future__ import annotations

import signal

import pytest
import yaml

from tandem.operator.kinds import DEPLOYMENT
from tests.disagg.nodes import wait_until
from tests.operator.e2e.cluster import second_identity
from tests.operator.e2e.helpers import (
    HANG_S,
    create,
    delete,
    llmd_from,
    patch_spec,
    wait_condition,
)

pytestmark = pytest.mark.e2e
FAST_LIVENESS = ("--liveness-period", "0.5", "--liveness-grace", "3")
RECONCILES = "tandem_operator_reconciles_total"


def leading(proc) -> bool:
    return proc.counter("tandem_operator_leader") == 1


def reconciles(proc) -> float:
    return proc.counter(RECONCILES)


def exits(proc) -> int:
    """The exit code, once the process has exited by itself."""
    assert wait_until(lambda: proc.proc.poll() is not None, timeout=HANG_S), proc.log()[-2000:]
    return proc.proc.returncode


@pytest.fixture
def llmd(setup, request):
    body = llmd_from(request.node.name.replace("_", "-")[5:40].strip("-"), setup.watched)
    yield body
    delete(setup.api, body)


def decode_replicas(setup, llmd) -> int | None:
    found = setup.api.get(DEPLOYMENT, setup.watched, f"{llmd['metadata']['name']}-decode")
    return None if found is None else found["spec"]["replicas"]


def test_one_of_two_replicas_reconciles_and_the_other_takes_over_when_it_dies(
    setup, start_operator, llmd
):
    first = start_operator("op-first")
    assert wait_until(lambda: leading(first), timeout=HANG_S)
    second = start_operator("op-second")  # healthy while it stands by
    create(setup.api, llmd)
    assert wait_until(lambda: decode_replicas(setup, llmd) == 1, timeout=HANG_S)
    assert not leading(second) and reconciles(second) == 0
    first.kill()  # SIGKILL: no chance to release the lease
    assert wait_until(lambda: leading(second), timeout=HANG_S)
    patch_spec(setup.api, llmd, {"decode": {"replicas": 2}})
    assert wait_until(lambda: decode_replicas(setup, llmd) == 2, timeout=HANG_S)
    assert wait_until(lambda: reconciles(second) > 0, timeout=HANG_S)  # counted once done


def test_sigterm_stops_the_leader_cleanly_and_hands_the_lease_over(setup, start_operator):
    first = start_operator("op-term")
    assert wait_until(lambda: leading(first), timeout=HANG_S)
    second = start_operator("op-next")
    first.proc.send_signal(signal.SIGTERM)
    assert exits(first) == 0
    assert "released lease" in first.log()
    assert wait_until(lambda: leading(second), timeout=HANG_S)


def test_the_operator_survives_an_api_server_restart_and_converges(
    cluster, setup, start_operator, llmd
):
    if cluster.plane is None:
        pytest.skip("the cluster was not started by the tests, which cannot restart it")
    # A lease longer than any restart here: this test is about the watch, not the lease
    # (a leader that cannot renew for a whole lease stops, as controller-runtime's does).
    proc = start_operator("op-restart", *FAST_LIVENESS, "--lease-duration", "900")
    assert wait_until(lambda: leading(proc), timeout=HANG_S)
    create(setup.api, llmd)
    assert wait_until(lambda: decode_replicas(setup, llmd) == 1, timeout=HANG_S)
    cluster.plane.crash_apiserver()
    try:
        assert wait_until(lambda: proc.healthz() == 503, timeout=HANG_S)
    finally:
        cluster.plane.start_apiserver()
    assert wait_until(lambda: proc.healthz() == 200, timeout=HANG_S)
    assert proc.proc.poll() is None, proc.log()[-2000:]
    patch_spec(setup.api, llmd, {"decode": {"replicas": 3}})  # a change after the restart
    assert wait_until(lambda: decode_replicas(setup, llmd) == 3, timeout=HANG_S)
    wait_condition(setup.api, llmd, "SpecValid", "True")  # status of the new generation


def test_a_leader_that_cannot_renew_its_lease_stops(cluster, setup, start_operator):
    """Two leaders must never reconcile at once: cut off for a whole lease, the leader
    exits (its pod restarts as a standby) rather than carry on unsure."""
    if cluster.plane is None:
        pytest.skip("the cluster was not started by the tests, which cannot stop its API server")
    proc = start_operator("op-cut-off", "--lease-duration", "3")
    assert wait_until(lambda: leading(proc), timeout=HANG_S)
    cluster.plane.crash_apiserver()
    try:
        assert exits(proc) == 1
    finally:
        cluster.plane.start_apiserver()
    assert "lost the leader lease" in proc.log()


def test_credentials_refused_at_start_exit_non_zero_saying_why(setup, start_operator, tmp_path):
    config = yaml.safe_load(setup.token_kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "not-a-token"
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(yaml.safe_dump(config))
    proc = start_operator("op-bad", kubeconfig=bad, wait=False)
    assert exits(proc) == 1
    assert "refused the operator's first call: 401" in proc.log()


def test_credentials_revoked_mid_run_fail_healthz_then_exit_non_zero(
    setup, start_operator, tmp_path
):
    kubeconfig = second_identity(setup, tmp_path, "tandem-revocable")
    proc = start_operator("op-revoked", *FAST_LIVENESS, kubeconfig=kubeconfig)
    assert wait_until(lambda: leading(proc), timeout=HANG_S)
    path = f"/api/v1/namespaces/{setup.operator_namespace}/serviceaccounts/tandem-revocable"
    setup.api._call("DELETE", path)  # its tokens are refused from now on
    assert wait_until(lambda: proc.healthz() in (503, None), timeout=HANG_S)
    assert exits(proc) == 1
    assert "refuses our credentials" in proc.log()
