"""Both wire layouts of vLLM's KV events decode to the index's layout: tagged maps (vLLM >= 0.28) and tagged
arrays (older vLLM, the emulator); only device-tier blocks are kept."""

from __future__ import annotations

import msgpack
import pytest

from progrouter.observe.kv_events import decode_batch

STORED_ARRAY = ["BlockStored", [b"h1", b"h2"], None, list(range(8)), 4, None, "GPU", None]
STORED_MAP = {
    "type": "BlockStored",
    "block_hashes": [b"h1", b"h2"],
    "parent_block_hash": None,
    "token_ids": list(range(8)),
    "block_size": 4,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "group_idx": 0,
}


def test_maps_and_arrays_decode_alike() -> None:
    as_map = decode_batch(
        msgpack.packb(
            [
                1.5,
                [
                    STORED_MAP,
                    {"type": "BlockRemoved", "block_hashes": [b"h2"], "medium": None},
                    {"type": "AllBlocksCleared"},
                ],
                0,
            ]
        )
    )
    as_array = decode_batch(
        msgpack.packb([1.5, [STORED_ARRAY, ["BlockRemoved", [b"h2"], None], ["AllBlocksCleared"]]])
    )
    assert as_map[1][1:] == as_array[1][1:] and as_map[1][0] == as_array[1][0][:7]  # array: + lora_name
    assert as_map[1][0][:5] == ["BlockStored", [b"h1", b"h2"], None, list(range(8)), 4]


def test_offloaded_tiers_are_not_credited() -> None:
    cpu = {**STORED_MAP, "medium": "CPU"}
    _, events = decode_batch(
        msgpack.packb([1.0, [cpu, {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"}]])
    )
    assert events == []


@pytest.mark.parametrize("batch", [[1.0, [{"block_hashes": []}]], [1.0, [7]], {"ts": 1}, [1.0]])
def test_malformed_batches_are_refused(batch: object) -> None:
    with pytest.raises(ValueError):
        decode_batch(msgpack.packb(batch))


def test_a_run_of_removals_is_one_event_in_order() -> None:
    def removed(h: int) -> dict[str, object]:
        return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"}

    sent = [removed(1), ["BlockRemoved", [2, 3], None], removed(4), STORED_MAP, removed(5), removed(6)]
    _, events = decode_batch(msgpack.packb([1.0, sent]))
    assert [e[0] for e in events] == ["BlockRemoved", "BlockStored", "BlockRemoved"]
    assert events[0] == ["BlockRemoved", [1, 2, 3, 4]] and events[2] == ["BlockRemoved", [5, 6]]
    with pytest.raises(ValueError, match="block hashes"):
        decode_batch(msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": 7}]]))
