"""An SGLang stream followed hash for hash: a model of SGLang's radix cache over real ZMQ.

SGLang's own package does not import here (it needs its GPU stack), so the publisher is
tests/sglang_radix.py's model of its RadixCache (insert, evict, reset, emitting BlockStored,
BlockRemoved and AllBlocksCleared as its source does), framed as SGLang 0.5.23's
ZmqEventPublisher frames them (`[topic, seq8, payload]` on a bound PUB socket; a ROUTER
answering replays, tests/test_subscriber.py's `Replayer`). One batch is lost on the live
socket and must come back through the replay socket; then the collector's map must equal the
model's own map: every page, its parent, its tokens, in SGLang's signed form.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

import pytest
import zmq

from kvscope.collector.dump import map_lines
from kvscope.collector.endpoints import replica_streams
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.subscriber import Collector, CollectorSettings
from kvscope.collector.types import StreamId, TableKey
from kvscope.lab.ports import free_port
from tests.sglang_events import sglang_batch
from tests.sglang_radix import RadixModel
from tests.test_subscriber import Replayer, wait_for

PAGE = 4
STEPS = 120
LOST = (37, 80)
"""Seqs published to the replay buffer only: the collector must replay them."""
RESET_AT = 60
SETTINGS = CollectorSettings(replay_timeout_s=2, tail_check_after_s=600)
"""No tail check: every replay is one the data asked for."""


def applied_up_to(ingest: StreamIngest, seq: int) -> bool:
    return ingest.last_seq == seq and not ingest.replaying


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


def steps(model: RadixModel, seed: int) -> Iterator[list[dict[str, object]]]:
    """Each scheduler step's events: prompts sharing a few system prompts, evictions under
    pressure, a reset half-way."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32_000) for _ in range(PAGE * rng.randint(2, 6))] for _ in range(3)]
    for step in range(STEPS):
        if step == RESET_AT:
            model.reset()
        for _ in range(rng.randint(0, 3)):
            suffix = [rng.randrange(32_000) for _ in range(rng.randint(0, 5 * PAGE))]
            model.insert(rng.choice(systems) + suffix)
        if rng.random() < 0.1:
            model.evict(rng.randint(1, 4))
        yield model.take_events()


def test_an_sglang_radix_cache_is_followed_exactly_through_a_replayed_gap(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    port, replay_port = free_port(), free_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    replayer = Replayer(ctx, replay_port, with_topic=True)
    model = RadixModel(PAGE, capacity=60)
    streams = replica_streams("sg", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}")
    try:
        with Collector(streams, settings=SETTINGS) as collector:
            ingest = collector.ingests[StreamId("sg", 0)]
            wait_for(lambda: collector.is_connected(ingest.stream) and not ingest.replaying)
            batches = [events for events in steps(model, seed=5) if events]
            # SGLang publishes nothing for a step without events. Two phases, one gap each:
            # a replay asked for the first gap cannot also bring the second.
            for phase in (range(0, LOST[1]), range(LOST[1], len(batches))):
                for seq in phase:
                    payload = sglang_batch(1_800_000_000.0 + seq, batches[seq])
                    replayer.buffer.append((seq, payload))
                    if seq not in LOST:
                        pub.send_multipart([b"t", seq.to_bytes(8, "big"), payload])
                wait_for(partial(applied_up_to, ingest, phase[-1]))
            assert len(batches) > max(LOST) + 1
            with collector.lock:
                lines = list(map_lines(ingest.map))
                table = ingest.map.tables[TableKey("GPU", 0)]
                tokens = {e.hash: e.token_ids for e in table.entries()}
                assert ingest.engine == "sglang"
                assert ingest.degraded is None
                assert ingest.counters.gaps == len(LOST)
                assert ingest.counters.replays_ok == 1 + len(LOST)
    finally:
        replayer.close()
        pub.close(linger=0)
    expected = {h: (p.parent, p.tokens) for h, p in model.pages.items()}
    assert len(expected) > 20, "the model holds a map worth checking"
    assert {line["hash"]: line["parent"] for line in lines} == {
        h: parent for h, (parent, _) in expected.items()
    }
    assert {h - (1 << 64) if h >= 1 << 63 else h: t for h, t in tokens.items()} == {
        h: t for h, (_, t) in expected.items()
    }
    assert all(line["count"] == 1 and line["hittable"] for line in lines)
