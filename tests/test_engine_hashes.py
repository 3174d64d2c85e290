"""vLLM's and SGLang's block hashes kept apart: the same integer is never the same block.

vLLM's hashes are unsigned 64-bit ints, SGLang's signed int64 (the first 16 hex digits of the
page's sha256): kvscope keeps both as the same 64 bits, so -1 and 2**64 - 1 are one key. They
could meet in three places, each tested here:
- across replicas (`POST /lookup`, `GET /replicas`): every stream has its own tables, and a
  lookup compares block contents, never hashes across streams;
- within one stream, when its publisher restarts as the other engine (a pod replaced under the
  same name): the new epoch's map starts empty, is told its engine again, and shows its hashes
  in its own engine's form;
- in the store: a stored instant of each epoch rebuilds that epoch's blocks only, in its form,
  and a reset's before map keeps its engine's form too (its prefix groups' roots).

SGLang's batches are built with tests/sglang_events.py, after SGLang 0.5.23's source (its
package does not import here without its GPU stack).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from sqlalchemy import select

from kvscope.collector.dump import map_lines, show_hash
from kvscope.collector.ingest import MESSAGES_BETWEEN_RESTARTS, StreamIngest
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, rebuild, stream_id
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.writer import StoreWriter
from tests.sglang_events import sglang_batch, sglang_cleared, sglang_stored

PAGE = 16
SAME = 2**64 - 1
"""vLLM's hash 2**64 - 1 and SGLang's -1: the same 64 bits."""
VLLM_TOKENS = list(range(PAGE))
SGLANG_TOKENS = list(range(100, 100 + PAGE))


def vllm_batch(ts: float) -> bytes:
    event = {
        "type": "BlockStored",
        "block_hashes": [SAME],
        "parent_block_hash": None,
        "token_ids": VLLM_TOKENS,
        "block_size": PAGE,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None],
        "group_idx": 0,
    }
    return msgspec.msgpack.encode([ts, [event], 0])


def sglang_one(ts: float) -> bytes:
    return sglang_batch(ts, [sglang_stored(-1, None, SGLANG_TOKENS)])


def frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


def hashes_shown(ingest: StreamIngest) -> list[object]:
    return [line["hash"] for line in map_lines(ingest.map)]


def test_across_replicas_the_same_integer_is_two_blocks() -> None:
    vllm = StreamIngest(StreamId("v", 0), can_replay=False)
    sglang = StreamIngest(StreamId("s", 0), can_replay=False)
    vllm.live_frames(frames(0, vllm_batch(1.0)), 1.0)
    sglang.live_frames(frames(0, sglang_one(1.0)), 1.0)
    assert (vllm.engine, sglang.engine) == ("vllm", "sglang")
    assert hashes_shown(vllm) == [SAME] and hashes_shown(sglang) == [-1]
    for tokens, hits in ((VLLM_TOKENS, {"v": 1, "s": 0}), (SGLANG_TOKENS, {"v": 0, "s": 1})):
        query = TokenQuery(tokens)
        found = {
            i.stream.replica: max(t.longest_prefix(query) for t in i.map.tables.values())
            for i in (vllm, sglang)
        }
        assert found == hits


def test_a_publisher_restarting_as_the_other_engine_starts_afresh_each_way() -> None:
    ingest = StreamIngest(StreamId("pod", 0), can_replay=False)
    ingest.live_frames(frames(0, vllm_batch(1.0)), 1.0)
    ingest.live_frames(frames(0, sglang_one(2.0)), 2.0)  # seq back to 0: another engine
    assert ingest.counters.restarts == 1
    assert ingest.engine == "sglang"
    assert hashes_shown(ingest) == [-1]
    assert [line["parent"] for line in map_lines(ingest.map)] == [None]
    for seq in range(1, MESSAGES_BETWEEN_RESTARTS + 1):  # restarts are spaced by messages
        ingest.live_frames(frames(seq, sglang_batch(2.0, [])), 2.0)
    ingest.live_frames(frames(0, vllm_batch(3.0)), 3.0)  # and back to vLLM
    assert (ingest.counters.restarts, ingest.engine) == (2, "vllm")
    assert hashes_shown(ingest) == [SAME]


def test_a_configured_engine_stays_through_restarts() -> None:
    ingest = StreamIngest(StreamId("pod", 0), can_replay=False, engine="vllm")
    ingest.live_frames(frames(0, vllm_batch(1.0)), 1.0)
    ingest.live_frames(frames(0, vllm_batch(2.0)), 2.0)
    assert ingest.counters.restarts == 1 and ingest.engine == "vllm"


def test_the_store_rebuilds_each_epoch_in_its_own_engine_form(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    writer = StoreWriter(engine)
    stream = StreamId("pod", 0)
    ingest = StreamIngest(stream, can_replay=False, sink=writer)
    ingest.live_frames(frames(0, vllm_batch(1.0)), 1.0)
    ingest.live_frames(frames(0, sglang_one(2.0)), 2.0)
    writer.close()
    with engine.connect() as conn:
        sid = stream_id(conn, stream.replica, stream.rank)
        shown = {
            epoch: [line["hash"] for line in map_lines(rebuilt.map)]
            for epoch in (0, 1)
            for rebuilt in [rebuild(conn, position_at_seq(conn, sid, 0, epoch), stream)]
        }
    engine.dispose()
    assert shown == {0: [SAME], 1: [-1]}


def test_vllms_own_session_id_does_not_make_it_sglang() -> None:
    """vLLM >= 0.30 may send `session_id` too; it always sends `group_idx`, SGLang never."""
    event = msgspec.msgpack.decode(vllm_batch(1.0))[1][0] | {"session_id": "chat-1"}
    vllm = StreamIngest(StreamId("v", 0), can_replay=False)
    vllm.live_frames(frames(0, msgspec.msgpack.encode([1.0, [event], 0])), 1.0)
    sglang_event = sglang_stored(-1, None, SGLANG_TOKENS, session_id="chat-1")
    del sglang_event["cache_salt"]  # however SGLang leaves out a salt it has not got
    sglang = StreamIngest(StreamId("s", 0), can_replay=False)
    sglang.live_frames(frames(0, sglang_batch(1.0, [sglang_event])), 1.0)
    assert (vllm.engine, sglang.engine) == ("vllm", "sglang")


def test_an_sglang_resets_before_map_keeps_its_signed_hashes(tmp_path: Path) -> None:
    engine = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    writer = StoreWriter(engine)
    ingest = StreamIngest(StreamId("pod", 0), can_replay=False, sink=writer)
    ingest.live_frames(frames(0, sglang_one(1.0)), 1.0)
    ingest.live_frames(frames(1, sglang_batch(2.0, [sglang_cleared()])), 2.0)
    writer.close()
    with engine.connect() as conn:
        reset_id = conn.execute(select(schema.resets.c.id)).scalar_one()
        found = reset_prefixes(conn, reset_id)
    engine.dispose()
    assert found.signed
    assert [show_hash(g.root, g.raw_root, found.signed) for g in found.groups] == [-1]
