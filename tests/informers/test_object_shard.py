"""Object shards (KEP-5866 sharded list and watch): the hash and the selector (pure), and informers over two
halves of a resource that partition it exactly, on a server with the ShardedListAndWatch gate (which filters)
and on the session's server without it (which ignores the selector: the informer filters)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from informers import GVR, ApiClient, ObjectShard, SharedIndexInformer
from informers.object_shard import SPACE, fnv1a64
from tests.helpers import create_configmaps, eventually, fresh_namespace

CONFIGMAPS = GVR("", "v1", "configmaps")


def test_the_hash_is_the_api_servers() -> None:
    # FNV-1a 64 reference values, and those the v1.36.3 apiserver's sharding package gives for these strings.
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"default") == 0xEBADA5168620C5FE
    assert fnv1a64(b"kube-system") == 0xDF65C7BC1D82B35E


def test_shards_cover_the_space_and_write_the_servers_syntax() -> None:
    shards = [ObjectShard.of(i, 3) for i in range(3)]
    assert shards[0].start == 0 and shards[-1].end == SPACE
    assert all(a.end == b.start for a, b in zip(shards, shards[1:]))
    assert ObjectShard.of(0, 2).selector() == \
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    assert ObjectShard.of(1, 2, "namespace").selector() == \
        "shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')"
    obj = {"metadata": {"uid": "6b3c1d52-9d0e-4c4e-8f55-1f0a3c1e2d4f", "namespace": "default"}}
    assert sum(s.contains(obj) for s in shards) == 1
    assert ObjectShard.of(1, 2, "namespace").contains(obj)  # 0xebad... is in the upper half
    for bad in [lambda: ObjectShard(5, 5), lambda: ObjectShard(0, SPACE + 1), lambda: ObjectShard.of(2, 2),
                lambda: ObjectShard(0, 1, "name")]:  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            bad()


async def _partition(client: ApiClient, served: bool) -> None:
    async with fresh_namespace(client, "shard") as ns:
        await create_configmaps(client, ns, 30)
        halves = [SharedIndexInformer(client, CONFIGMAPS, namespace=ns, shard=ObjectShard.of(i, 2)) for i in range(2)]
        whole = SharedIndexInformer(client, CONFIGMAPS, namespace=ns)
        for inf in (*halves, whole):
            inf.start()
        try:
            def partitioned() -> bool:
                keys = [set(inf.store.keys()) for inf in halves]
                return not keys[0] & keys[1] and keys[0] | keys[1] == set(whole.store.keys()) and \
                    all(halves[i].reflector.shard.contains(o) for i in range(2)  # type: ignore[union-attr]
                        for o in halves[i].store.list())

            await eventually(lambda: all(i.has_synced() for i in (*halves, whole)))
            await eventually(partitioned, what="two halves partition the cache")
            assert len(whole.store.keys()) >= 30 and all(len(h.store.keys()) > 0 for h in halves)
            assert [h.reflector.shard_served for h in halves] == [served, served]
            # The watch path: new objects and deletions land in exactly one half.
            await create_configmaps(client, ns, 10, prefix="late")
            for name in [f"cm-{i}" for i in range(0, 30, 3)]:
                await client.request("DELETE", CONFIGMAPS.path(ns, name))
            await eventually(lambda: partitioned() and len(whole.store.keys()) == 30 + 10 - 10 + _extra(whole),
                             what="the halves follow creates and deletes")
        finally:
            await asyncio.gather(*(inf.stop() for inf in (*halves, whole)))


def _extra(whole: SharedIndexInformer) -> int:
    """ConfigMaps the API server puts in every namespace (kube-root-ca.crt)."""
    return sum(1 for k in whole.store.keys() if not k.split("/", 1)[1].startswith(("cm-", "late-")))


async def test_informers_over_two_shards_with_the_gate(control_plane_factory: Callable[..., Any]) -> None:
    cp = await asyncio.to_thread(control_plane_factory, ["--feature-gates=ShardedListAndWatch=true"])
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as client:
        await _partition(client, served=True)


async def test_informers_over_two_shards_without_the_gate(control_plane: Any) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await _partition(client, served=False)
