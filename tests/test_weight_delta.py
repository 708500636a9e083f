"""A bucket of weights as its change since the last push (`policy/weight_delta.py`), and
an engine actor's held buckets taking a push (`HeldBuckets`): from the deltas where they
apply, whole from Ray's object store where they do not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reinforge.policy.weight_buckets import Bucket, pack, total_bytes
from reinforge.policy.weight_delta import apply, encode

from .conftest import require_extra


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(64, 32, generator=generator),
        "b": torch.randn(1000, generator=generator),
        "steps": torch.arange(6),  # int64 beside bf16: compared as 2-byte words
    }


def changed(tensors: dict[str, torch.Tensor], share: float) -> dict[str, torch.Tensor]:
    """`tensors` with about `share` of their floating elements moved far enough that bf16
    sees it."""
    generator = torch.Generator().manual_seed(1)
    out = {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            hit = torch.rand(tensor.shape, generator=generator) < share
            tensor = torch.where(hit, tensor * 1.5 + 0.25, tensor)
        out[name] = tensor
    return out


def test_a_delta_rebuilds_the_new_bucket_exactly_and_is_smaller():
    old = pack(weights(), torch.bfloat16)
    for share, bitmask in ((0.02, False), (0.3, True)):  # positions when sparse, else a mask
        new = pack(changed(weights(), share), torch.bfloat16)
        assert len(old) == len(new) == 1
        delta = encode(old[0], new[0], base=3)
        assert delta is not None and delta.bitmask == bitmask and delta.word == 2
        assert 0 < delta.nbytes < new[0].data.nbytes
        back = apply(old[0], 3, delta)
        assert back is not None and back.entries == new[0].entries
        assert np.array_equal(back.data, new[0].data)  # the very bytes a full push gives
        assert not np.array_equal(old[0].data, new[0].data)  # old is left as it was


def test_a_bucket_that_did_not_change_is_an_empty_delta():
    old, new = pack(weights(), torch.bfloat16), pack(weights(), torch.bfloat16)
    delta = encode(old[0], new[0], base=1)
    assert delta is not None and delta.values.size == 0
    assert delta.nbytes == 0 and np.array_equal(apply(old[0], 1, delta).data, new[0].data)


def test_a_bucket_whose_every_element_changed_goes_whole():
    """fp32 after an optimizer step: nearly every element changes."""
    old = pack(weights())
    assert encode(old[0], pack(changed(weights(), 1.0))[0], base=1) is None
    assert encode(old[0], pack(weights(seed=5))[0], base=1) is None


def test_a_bucket_of_another_layout_goes_whole():
    old = pack(weights(), torch.bfloat16)
    renamed = {("c" if name == "a" else name): t for name, t in changed(weights(), 0.01).items()}
    reshaped = {**weights(), "a": weights()["a"].reshape(32, 64)}
    for other in (renamed, reshaped):
        assert encode(old[0], pack(other, torch.bfloat16)[0], base=1) is None
    assert encode(old[0], pack(weights())[0], base=1) is None  # fp32 now: twice the bytes


def test_a_delta_applies_only_to_its_base():
    old = pack(weights(), torch.bfloat16)
    new = pack(changed(weights(), 0.02), torch.bfloat16)
    delta = encode(old[0], new[0], base=3)
    assert apply(old[0], 2, delta) is None and apply(old[0], None, delta) is None
    # the right version but other bytes (a base the delta was not made from): caught
    other = pack(changed(weights(), 0.05), torch.bfloat16)
    assert apply(other[0], 3, delta) is None


def test_held_buckets_take_deltas_and_fetch_whole_buckets_only_where_needed():
    require_extra("ray", "ray")
    import ray

    from reinforge.orchestrate.ray_engine_actor import FETCHERS, HeldBuckets, Push

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        v1 = pack(weights(), torch.bfloat16, bucket_bytes=2048)
        v2 = pack(changed(weights(), 0.02), torch.bfloat16, bucket_bytes=2048)
        assert len(v1) > 1
        full1, full2 = [ray.put(b) for b in v1], [ray.put(b) for b in v2]
        sizes = [b.data.nbytes for b in v1]
        push1 = Push(1, 0, [None] * len(v1), full1, sizes, keep=True)
        deltas = [encode(a, b, base=1) for a, b in zip(v1, v2, strict=True)]
        assert all(d is not None for d in deltas)
        push2 = Push(2, 1, [ray.put(d) for d in deltas], full2, sizes, keep=True)

        def nowhere(index: int, bucket: Bucket) -> None:
            """What is taken is checked on what the actor holds, not where it was laid."""

        def same(held: HeldBuckets, buckets: list[Bucket]) -> bool:
            pairs = zip(held.buckets, buckets, strict=True)
            return all(np.array_equal(h.data, b.data) and h.entries == b.entries for h, b in pairs)

        # no base (a new or restarted actor): every bucket whole
        fresh = HeldBuckets()
        assert fresh.take(push2, nowhere)[1] == total_bytes(v2)
        assert same(fresh, v2) and fresh.version == 2
        # the push before held: the deltas alone
        held = HeldBuckets()
        assert held.take(push1, nowhere)[1] == total_bytes(v1)
        assert held.take(push2, nowhere)[1] == sum(d.nbytes for d in deltas) < total_bytes(v2) / 4
        assert same(held, v2) and held.buckets[0].data.flags.writeable
        # a base whose bytes are not the delta's (one bucket spoilt): that bucket whole
        spoilt = HeldBuckets()
        spoilt.take(push1, nowhere)
        data = spoilt.buckets[1].data.copy()
        data[:2] ^= 0xFF
        spoilt.buckets[1] = Bucket(spoilt.buckets[1].entries, data)
        laid: list[tuple[int, bytes]] = []
        _, moved = spoilt.take(push2, lambda i, bucket: laid.append((i, bucket.data.tobytes())))
        assert moved == sum(d.nbytes for d in deltas) + v2[1].data.nbytes
        assert same(spoilt, v2)
        # every bucket laid once with its index, whether built here or fetched whole
        assert sorted(laid) == [(i, bucket.data.tobytes()) for i, bucket in enumerate(v2)]
        # more buckets than fetching threads: every one still laid once, with its index
        many = pack({f"t{i}": torch.full((4,), float(i)) for i in range(3 * FETCHERS)}, None, 16)
        sizes_many = [bucket.data.nbytes for bucket in many]
        laid.clear()
        whole = Push.whole(1, [ray.put(b) for b in many], sizes_many, keep=False)
        HeldBuckets().take(whole, lambda i, bucket: laid.append((i, bucket.data.tobytes())))
        assert sorted(laid) == [(i, bucket.data.tobytes()) for i, bucket in enumerate(many)]
        # another base version: whole, no delta fetched
        behind = HeldBuckets()
        behind.take(push1, nowhere)
        other_base = Push(3, 2, push2.deltas, full2, sizes, keep=True)
        assert behind.take(other_base, nowhere)[1] == total_bytes(v2)
        assert same(behind, v2)
        # without `delta` nothing is kept: the store may free the buckets
        dropped = HeldBuckets()
        unkept = Push(1, 0, [None] * len(v1), full1, sizes, keep=False)
        buckets, moved = dropped.take(unkept, nowhere)
        assert moved == total_bytes(v1) and len(buckets) == len(v1)
        assert (dropped.buckets, dropped.version) == ([], None)
    finally:
        ray.shutdown()


@pytest.mark.parametrize("word", [np.uint8, np.uint16, np.uint32])
def test_positions_index_words_of_the_bucket_element_size(word):
    """Every element size a bucket holds compares as its own words."""
    dtype = {np.uint8: torch.uint8, np.uint16: torch.bfloat16, np.uint32: torch.float32}[word]
    old = pack({"w": torch.zeros(4096, dtype=dtype)})
    new = pack({"w": torch.zeros(4096, dtype=dtype).index_fill(0, torch.tensor([7, 99]), 1)})
    delta = encode(old[0], new[0], base=0)
    assert delta.word == np.dtype(word).itemsize and delta.values.size == 2
    assert delta.where.tolist() == [7, 99]
    assert np.array_equal(apply(old[0], 0, delta).data, new[0].data)
