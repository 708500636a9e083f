"""The engine's KV cache: the same states as transformers' own, without a copy per token."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from reinforge.policy.kv_cache import ROOM, RoomyLayer, joined_room, roomy_cache
from reinforge.policy.models import load_model


def test_decoding_through_room_equals_the_dynamic_cache() -> None:
    model, _ = load_model("tiny-random")
    torch.manual_seed(0)
    prompt = torch.randint(0, 1000, (3, 7))  # (B, P)
    caches = {"dynamic": DynamicCache(), "roomy": roomy_cache()}
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in caches}
    with torch.inference_mode():
        for name, cache in caches.items():
            ids = prompt
            for _ in range(ROOM + 5):  # runs out of room once
                out = model(input_ids=ids, cache=cache, use_cache=True)
                logits[name].append(out.logits[:, -1])
                ids = out.logits[:, -1:].argmax(dim=-1)  # (B, 1)
    for dynamic, roomy in zip(logits["dynamic"], logits["roomy"], strict=True):
        torch.testing.assert_close(roomy, dynamic, rtol=0, atol=0)
    for dynamic, roomy in zip(caches["dynamic"].layers, caches["roomy"].layers, strict=True):
        assert isinstance(roomy, RoomyLayer)
        assert roomy.keys.shape[-2] == 7 + ROOM + 4  # every fed token is cached
        torch.testing.assert_close(roomy.keys, dynamic.keys, rtol=0, atol=0)
        torch.testing.assert_close(roomy.values, dynamic.values, rtol=0, atol=0)


def test_appends_write_in_place_until_the_room_is_full() -> None:
    layer = RoomyLayer()
    states = torch.randn(2, 3, 5, 4)  # (B, H, L, D)
    keys, _ = layer.update(states, states)
    start = keys.data_ptr()
    for step in range(ROOM):
        new = torch.full((2, 3, 1, 4), float(step))
        keys, _ = layer.update(new, new)
        assert keys.data_ptr() == start  # no copy
        assert torch.equal(keys[:, :, -1:], new)
    torch.testing.assert_close(keys[:, :, :5], states, rtol=0, atol=0)
    keys, _ = layer.update(new, new)  # the room is full: a new one holds everything
    assert keys.data_ptr() != start
    assert keys.shape == (2, 3, 5 + ROOM + 1, 4)
    torch.testing.assert_close(keys[:, :, :5], states, rtol=0, atol=0)


def test_states_replaced_from_outside_get_new_room() -> None:
    """The engine's merge and retire assign `keys`/`values`; the room must not outlive them."""
    layer = RoomyLayer()
    layer.update(torch.zeros(4, 1, 2, 2), torch.zeros(4, 1, 2, 2))
    layer.update(torch.zeros(4, 1, 1, 2), torch.zeros(4, 1, 1, 2))  # appended in place
    kept = torch.ones(2, 1, 3, 2)  # two rows retired: a fresh, smaller tensor
    layer.keys, layer.values = kept.clone(), kept.clone()
    new = torch.full((2, 1, 1, 2), 2.0)
    keys, values = layer.update(new, new)
    assert keys.shape == values.shape == (2, 1, 4, 2)
    assert torch.equal(keys[:, :, :3], kept) and torch.equal(keys[:, :, 3:], new)
    layer.crop(-2)  # a shorter view of the same room: the next column overwrites the cut
    keys, _ = layer.update(new * 2, new * 2)
    assert keys.shape == (2, 1, 3, 2)
    assert torch.equal(keys[:, :, :2], kept[:, :, :2]) and torch.equal(keys[:, :, 2:], new * 2)
    layer.keys = layer.keys.clone()  # the same shape, other storage: still not the room
    layer.keys[:, :, 0] = 5.0
    keys, _ = layer.update(new, new)
    assert keys.shape == (2, 1, 4, 2) and torch.equal(keys[:, :, 0], torch.full((2, 1, 2), 5.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_kept_move_up_in_the_room_and_later_appends_stay_in_place(dtype) -> None:
    layer = RoomyLayer()
    states = torch.randn(4, 2, 5, 3).to(dtype)  # (B, H, L, D)
    layer.update(states, states.neg())
    storage = layer.keys.untyped_storage().data_ptr()
    # rows 1 and 3 leave; the first two columns have become padding in rows 0 and 2
    layer.keep(torch.tensor([0, 2]), first_moved=1, start=2)
    assert torch.equal(layer.keys, states[[0, 2], :, 2:])
    assert torch.equal(layer.values, states.neg()[[0, 2], :, 2:])
    new = torch.ones(2, 2, 1, 3, dtype=dtype)
    keys, values = layer.update(new, new)
    assert keys.untyped_storage().data_ptr() == storage  # still the same room: no copy
    assert torch.equal(keys, torch.cat([states[[0, 2], :, 2:], new], dim=2))
    assert torch.equal(values, torch.cat([states.neg()[[0, 2], :, 2:], new], dim=2))
    layer.keep(torch.tensor([1]), first_moved=0, start=0)  # the first row leaves
    for _ in range(ROOM):  # past the room's end: a new room holds the row
        keys, _ = layer.update(new[:1] * 2, new[:1] * 2)
    assert keys.shape == (1, 2, 4 + ROOM, 3)
    assert torch.equal(keys[:, :, :3], states[[2], :, 2:])
    assert keys.untyped_storage().data_ptr() != storage


def test_rows_kept_from_states_set_outside_are_selected_by_copy() -> None:
    layer = RoomyLayer()
    layer.update(torch.zeros(3, 1, 2, 2), torch.zeros(3, 1, 2, 2))
    merged = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 1, 4, 2)  # as a merge sets
    layer.keys, layer.values = merged, merged.clone()
    layer.keep(torch.tensor([0, 2]), first_moved=1, start=1)
    assert torch.equal(layer.keys, merged[[0, 2], :, 1:])
    assert torch.equal(merged, torch.arange(24, dtype=torch.float32).view(3, 1, 4, 2))  # untouched
    keys, _ = layer.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))
    assert torch.equal(keys, torch.cat([merged[[0, 2], :, 1:], torch.ones(2, 1, 1, 2)], dim=2))


def test_the_last_rows_of_states_set_outside_are_kept_as_views() -> None:
    """Dropping the last row (the engine's answer to an out-of-memory) allocates nothing."""
    layer = RoomyLayer()
    merged = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 1, 4, 2)  # as a merge sets
    layer.keys, layer.values = merged, merged.clone()
    layer.keep(torch.tensor([0, 1]), first_moved=2, start=1)
    assert torch.equal(layer.keys, merged[:2, :, 1:])
    assert layer.keys.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()


def test_a_cut_undoes_a_failed_steps_appends_and_keeps_the_room() -> None:
    layer = RoomyLayer()
    states = torch.randn(2, 1, 3, 2)
    layer.update(states, states.neg())
    storage = layer.keys.untyped_storage().data_ptr()
    layer.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))  # a step that then failed
    layer.cut(3)
    assert torch.equal(layer.keys, states) and torch.equal(layer.values, states.neg())
    new = torch.full((2, 1, 1, 2), 2.0)
    keys, values = layer.update(new, new)  # the step again: in place, in the same room
    assert keys.untyped_storage().data_ptr() == storage
    assert torch.equal(keys, torch.cat([states, new], dim=2))
    assert torch.equal(values, torch.cat([states.neg(), new], dim=2))
    layer.keys = layer.keys.clone()  # set from outside: the cut is a view of it
    layer.cut(2)
    assert torch.equal(layer.keys, states[:, :, :2]) and layer.values.shape[-2] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_joined_into_one_room_are_right_aligned_and_later_appends_stay_in_place(dtype) -> None:
    layer = RoomyLayer()
    running = torch.randn(2, 3, 4, 5).to(dtype)  # (B, H, L, D)
    layer.update(running, running.neg())
    layer.update(torch.ones(2, 3, 1, 5, dtype=dtype), torch.ones(2, 3, 1, 5, dtype=dtype))
    old_keys, old_values = layer.keys, layer.values  # a view of the first room, 5 wide
    wide = torch.randn(1, 3, 7, 5).to(dtype)  # an arrival wider than the running rows
    rooms = joined_room(old_keys, wide, 7), joined_room(old_values, wide.neg(), 7)
    layer.take_room(*rooms, 7)
    pad = torch.zeros(2, 3, 2, 5, dtype=dtype)
    assert torch.equal(layer.keys, torch.cat([torch.cat([pad, old_keys], dim=2), wide]))
    assert torch.equal(layer.values, torch.cat([torch.cat([pad, old_values], dim=2), wide.neg()]))
    storage = layer.keys.untyped_storage().data_ptr()
    new = torch.full((3, 3, 1, 5), 2.0, dtype=dtype)
    for _ in range(ROOM):
        keys, _ = layer.update(new, new)
        assert keys.untyped_storage().data_ptr() == storage  # the join's room: no copy
    assert keys.shape == (3, 3, 7 + ROOM, 5) and torch.equal(
        keys[:, :, 7:], new.expand(-1, -1, ROOM, -1)
    )
    narrow = torch.randn(2, 3, 3, 5).to(dtype)  # arrivals narrower than the running rows
    room = joined_room(layer.keys, narrow, 7 + ROOM)
    assert torch.equal(room[3:, :, : 4 + ROOM], torch.zeros(2, 3, 4 + ROOM, 5, dtype=dtype))
    assert torch.equal(room[3:, :, 4 + ROOM : 7 + ROOM], narrow)
    assert torch.equal(room[:3, :, : 7 + ROOM], layer.keys)


def _freed_full_of_nan(shape: tuple[int, ...]) -> None:
    """Leave a block of `shape`'s size full of NaN to the allocator, which hands it back to
    the next request of that size as a rule: an uninitialised room would hold NaN."""
    poison = torch.full(shape, float("nan"))
    del poison


def test_whole_rows_hold_the_states_among_finite_columns() -> None:
    """Attention reads a room's whole rows and masks the columns that are not the states,
    which works only on finite numbers (-inf + NaN and 0 x NaN are NaN): a new room's
    spare columns are zeros, whatever memory it was made from."""
    for _ in range(3):
        layer = RoomyLayer()
        states = torch.randn(4, 2, 5, 3)  # (B, H, L, D)
        _freed_full_of_nan((4, 2, 5 + ROOM, 3))
        layer.update(states, states.neg())
        layer.keep(torch.tensor([0, 2]), first_moved=1, start=2)  # rows 1 and 3 leave
        keys, values, start = layer.whole_rows()
        assert keys.shape == values.shape == (2, 2, 5 + ROOM, 3) and start == 2
        assert keys.is_contiguous() and values.is_contiguous()
        assert torch.equal(keys[:, :, 2:5], layer.keys) and torch.equal(
            values[:, :, 2:5], layer.values
        )
        assert torch.isfinite(keys).all() and torch.isfinite(values).all()

        running = layer.keys
        arrival = torch.randn(1, 2, 6, 3)
        _freed_full_of_nan((3, 2, 6 + ROOM, 3))
        layer.take_room(joined_room(running, arrival, 6), joined_room(running, arrival, 6), 6)
        keys, _, start = layer.whole_rows()
        assert start == 0 and torch.isfinite(keys).all()


def test_states_set_from_outside_are_their_own_whole_rows() -> None:
    layer = RoomyLayer()
    layer.update(torch.zeros(2, 1, 3, 2), torch.zeros(2, 1, 3, 2))
    layer.keys, layer.values = torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2)
    keys, values, start = layer.whole_rows()
    assert keys is layer.keys and values is layer.values and start == 0
