"""The deployment's token: the operator makes its Secret once (random, owned by the
resource, never pruned, never rewritten), every pod reads it by reference, and the operator
needs only `create` on Secrets (it can read none)."""

from __future__ import annotations

from tandem.engine.api.deployment_token import ENV
from tandem.operator.kinds import SECRET, permissions
from tandem.operator.names import TOKEN_KEY, token_secret_name
from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tests.operator.crd_schema import example
from tests.operator.fake_api import FakeApi


def secret(api: FakeApi, name: str = "llama") -> dict:
    return api.objects[("Secret", "default", token_secret_name(name))]


def test_the_first_reconcile_makes_one_random_token_owned_by_the_resource():
    api, llmd = FakeApi(), example("minimal")
    llmd["metadata"]["uid"] = "uid-1"
    Reconciler(api).reconcile(llmd)
    made = secret(api)
    token = made["stringData"][TOKEN_KEY]
    assert len(token) >= 32 and made["type"] == "Opaque"
    (owner,) = made["metadata"]["ownerReferences"]
    assert owner["uid"] == "uid-1" and owner["controller"] is True
    other_api = FakeApi()
    Reconciler(other_api).reconcile(example("minimal"))
    assert secret(other_api)["stringData"][TOKEN_KEY] != token  # not derived from the spec


def test_an_existing_token_is_kept_and_never_pruned():
    api, llmd = FakeApi(), example("minimal")
    Reconciler(api).reconcile(llmd)
    token = secret(api)["stringData"][TOKEN_KEY]
    outcome = Reconciler(api).reconcile(llmd)  # a restarted operator: it creates again
    assert secret(api)["stringData"][TOKEN_KEY] == token
    assert not any(key.startswith("Secret/") for key in outcome.pruned)


def test_a_deleted_token_comes_back_new_at_the_next_reconcile():
    api, llmd = FakeApi(), example("minimal")
    reconciler = Reconciler(api)
    reconciler.reconcile(llmd)
    old = secret(api)["stringData"][TOKEN_KEY]
    del api.objects[("Secret", "default", token_secret_name("llama"))]
    reconciler.reconcile(llmd)
    assert secret(api)["stringData"][TOKEN_KEY] != old


def test_every_pod_reads_the_token_by_reference():
    llmd = example("minimal")
    pods = [o for o in render(llmd) if o["kind"] == "Deployment"]
    assert len(pods) == 3
    for deployment in pods:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        (env,) = [e for e in container["env"] if e["name"] == ENV]
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref == {"name": token_secret_name("llama"), "key": TOKEN_KEY}


def test_the_operator_may_create_secrets_and_do_nothing_else_with_them():
    verbs = {verb for group, resource, verb in permissions() if resource == SECRET.plural}
    assert verbs == {"create"}
