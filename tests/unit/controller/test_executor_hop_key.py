"""The fleet's hop-key Secret as the reconcile keeps it: created once with a random key, owned by
the fleet, never rewritten, made again only if it goes missing while the frontend is not ready."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fake_kube import FakeKube, controller, fake, load_example, make_ready

from kvretention.common.hop_auth import parse_hop_keys
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import CR_KIND

__all__ = ["fake"]

FLEET = ("ns", "qwen")
SECRET = ("secrets", "ns", "qwen-hop-key")


def auth_fleet(fake: FakeKube) -> dict[str, Any]:
    body = load_example("aggregated")
    body["spec"].setdefault("frontend", {})["auth"] = {"secretRefs": [{"name": "fleet-keys"}]}
    fake.put(kinds.SECRET, {"metadata": {"name": "fleet-keys", "namespace": "ns"}})
    return fake.put(CR_KIND, body)


def hop_key(fake: FakeKube) -> str:
    return base64.b64decode(fake.objects[SECRET]["data"]["hop-key"]).decode()


async def test_an_auth_fleet_gets_a_random_key_once_and_keeps_it(fake: FakeKube) -> None:
    cr = auth_fleet(fake)
    c = controller(fake)
    await c.reconcile(FLEET)
    secret = fake.objects[SECRET]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "KvRetentionDeployment",
        cr["metadata"]["uid"],
        True,
    )
    key = hop_key(fake)
    assert len(parse_hop_keys(key).keys[0]) == 64  # 32 random bytes, in hex
    # reconciles while the frontend starts look again and change nothing
    await c.reconcile(FLEET)
    assert hop_key(fake) == key
    assert [w for w in fake.writes if w[0] == "create Secret"] == [
        ("create Secret", "qwen-hop-key")
    ]
    make_ready(fake)
    await c.reconcile(FLEET)
    fake.reads.clear()
    await c.reconcile(FLEET)  # a ready frontend: the Secret is not even looked at
    assert ("GET", "secrets") not in fake.reads
    assert hop_key(fake) == key


async def test_a_restarted_operator_keeps_the_key(fake: FakeKube) -> None:
    auth_fleet(fake)
    await controller(fake).reconcile(FLEET)
    key = hop_key(fake)
    await controller(fake).reconcile(FLEET)  # a new operator process: nothing remembered
    assert hop_key(fake) == key


async def test_a_secret_of_that_name_is_used_as_it_is(fake: FakeKube) -> None:
    """How a fleet gets a key of its own choosing: the operator never rewrites it."""
    auth_fleet(fake)
    mine = {"metadata": {"name": "qwen-hop-key", "namespace": "ns"}, "data": {"hop-key": "eA=="}}
    fake.put(kinds.SECRET, mine)
    await controller(fake).reconcile(FLEET)
    assert fake.objects[SECRET]["data"] == {"hop-key": "eA=="}
    assert not [w for w in fake.writes if w[0] == "create Secret"]


async def test_a_key_deleted_before_the_frontend_is_ready_is_made_again(fake: FakeKube) -> None:
    auth_fleet(fake)
    c = controller(fake)
    await c.reconcile(FLEET)
    del fake.objects[SECRET]
    await c.reconcile(FLEET)
    assert SECRET in fake.objects


async def test_a_fleet_without_auth_gets_no_hop_key(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    await controller(fake).reconcile(FLEET)
    assert SECRET not in fake.objects
    assert ("GET", "secrets") not in fake.reads


async def test_a_refused_create_is_said_in_status_and_retried(fake: FakeKube) -> None:
    auth_fleet(fake)

    async def refused(*_: Any) -> bool:
        raise k.ApiError(403, 'secrets is forbidden: cannot create resource "secrets"')

    fake.create_if_absent = refused  # type: ignore[method-assign]
    with pytest.raises(k.RetryLater, match="Secret qwen-hop-key: HTTP 403"):
        await controller(fake).reconcile(FLEET)
    messages = [c["message"] for c in fake.cr()["status"]["conditions"]]
    assert any("Secret qwen-hop-key" in m and "forbidden" in m for m in messages), messages


def set_auth(fake: FakeKube, on: bool) -> None:
    frontend = fake.cr()["spec"].setdefault("frontend", {})
    if on:
        frontend["auth"] = {"secretRefs": [{"name": "fleet-keys"}]}
    else:
        frontend.pop("auth", None)


async def test_turning_auth_off_deletes_the_key_the_fleet_made_once(fake: FakeKube) -> None:
    auth_fleet(fake)
    c = controller(fake)
    await c.reconcile(FLEET)
    make_ready(fake)
    await c.reconcile(FLEET)
    assert SECRET in fake.objects
    set_auth(fake, False)
    await c.reconcile(FLEET)
    assert SECRET not in fake.objects
    frontend = fake.objects[("deployments", "ns", "qwen-frontend")]["spec"]["template"]["spec"]
    assert not [v for v in frontend.get("volumes") or [] if "secret" in v]
    fake.reads.clear()
    await c.reconcile(FLEET)  # the frontend mounts no key now: nothing more is looked up
    assert ("GET", "secrets") not in fake.reads


async def test_turning_auth_off_keeps_a_key_its_user_made(fake: FakeKube) -> None:
    auth_fleet(fake)
    mine = {"metadata": {"name": "qwen-hop-key", "namespace": "ns"}, "data": {"hop-key": "eA=="}}
    fake.put(kinds.SECRET, mine)
    c = controller(fake)
    await c.reconcile(FLEET)
    set_auth(fake, False)
    await c.reconcile(FLEET)
    assert fake.objects[SECRET]["data"] == {"hop-key": "eA=="}


async def test_auth_turned_on_again_gets_a_new_key(fake: FakeKube) -> None:
    auth_fleet(fake)
    c = controller(fake)
    await c.reconcile(FLEET)
    first = hop_key(fake)
    make_ready(fake)
    await c.reconcile(FLEET)
    set_auth(fake, False)
    await c.reconcile(FLEET)
    set_auth(fake, True)
    await c.reconcile(FLEET)  # the status still says the frontend is ready
    assert hop_key(fake) != first


async def test_a_failed_delete_of_the_retired_key_is_tried_again(fake: FakeKube) -> None:
    """The reconcile that turns auth off is the only one that sees the frontend mount the key:
    a delete it could not make is remembered and made on the next reconcile."""
    auth_fleet(fake)
    c = controller(fake)
    await c.reconcile(FLEET)
    make_ready(fake)
    await c.reconcile(FLEET)
    set_auth(fake, False)
    delete = fake.delete

    async def refused(*_: Any, **__: Any) -> None:
        raise k.ApiError(503, "etcdserver: request timed out")

    fake.delete = refused  # type: ignore[method-assign]
    await c.reconcile(FLEET)
    assert SECRET in fake.objects
    await c.reconcile(FLEET)  # still refused: still remembered
    assert SECRET in fake.objects
    fake.delete = delete  # type: ignore[method-assign]
    await c.reconcile(FLEET)
    assert SECRET not in fake.objects
    fake.reads.clear()
    await c.reconcile(FLEET)  # done: nothing more is looked up
    assert ("GET", "secrets") not in fake.reads
