"""Receiving whole messages straight from libzmq (collector/_zmq_recv.pyx), over real sockets.

The compiled receiver must hand over exactly what pyzmq's `recv_message` would, for every frame
count, and must never wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from kvscope.collector import _zmq_recv
from kvscope.collector.sockets import message_reader, recv_message

MESSAGES = [
    [b"", (7).to_bytes(8, "big"), b"\x93\xcb" + bytes(900)],
    [b"only one frame"],
    [b"kv", b"two"],
    [b"a", b"b", b"c", b"d", b"e"],
    [b"", b"", b""],
    [b"big", bytes(3 * 1024 * 1024)],
    [b"many", *[bytes(10)] * 3000],
]
KEPT = [m[: _zmq_recv.MAX_FRAMES_KEPT] for m in MESSAGES]
"""A message of more frames is refused whole: what is past its fourth is dropped uncopied."""


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    # Slow joiner: publish until the subscription has reached the publisher.
    while not sub.poll(20):
        pub.send(b"warm-up")
    while sub.poll(50):
        sub.recv_multipart()
    yield pub, sub
    pub.close(linger=0)
    sub.close(linger=0)
    ctx.term()


def _arrive(sub: zmq.Socket[bytes]) -> None:
    assert sub.poll(5000), "the message did not arrive"
    time.sleep(0.02)  # the rest of a batch sent at once


def test_libzmq_is_found_here() -> None:
    # CI installs pyzmq's wheel, whose libzmq the receiver finds: the fast path is what runs.
    assert _zmq_recv.available()


def test_receives_every_frame_count_as_pyzmq_does(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    pub, sub = pair
    read = _zmq_recv.MessageReceiver(sub)
    for message in MESSAGES:
        pub.send_multipart(message)
    _arrive(sub)
    got = [read() for _ in MESSAGES]
    assert got == KEPT
    assert read() is None  # nothing waiting: returns at once

    for message in MESSAGES:
        pub.send_multipart(message)
    _arrive(sub)
    assert [recv_message(sub) for _ in MESSAGES] == got


def test_a_closed_socket_raises_instead_of_crashing(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    _pub, sub = pair
    read = _zmq_recv.MessageReceiver(sub)
    sub.close(linger=0)
    with pytest.raises(zmq.ZMQError):
        read()


def test_pyzmq_fallback_when_libzmq_is_not_found(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pub, sub = pair
    monkeypatch.setattr(_zmq_recv, "available", lambda: False)  # the module sockets reads
    read = message_reader(sub)
    assert not isinstance(read, _zmq_recv.MessageReceiver)
    assert read() is None
    for message in MESSAGES:
        pub.send_multipart(message)
    _arrive(sub)
    assert [read() for _ in MESSAGES] == KEPT


class _Asked(zmq.Socket[bytes]):
    """A socket whose class reads its attributes its own way: the receiver asks it so."""

    asked = 0

    def __getattribute__(self, name: str) -> object:
        if name == "_closed":
            type(self).asked += 1
        return super().__getattribute__(name)


def test_a_socket_that_reads_its_own_attributes_is_asked_whether_it_is_closed() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = _Asked(ctx, zmq.SUB)
    try:
        read = _zmq_recv.MessageReceiver(sub)
        asked = _Asked.asked
        assert read() is None
        assert _Asked.asked == asked + 1
        sub.close(linger=0)
        with pytest.raises(zmq.ZMQError):
            read()
    finally:
        sub.close(linger=0)
        ctx.term()


def test_a_topic_heard_again_is_the_same_bytes_object(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    # The fleet's router looks each topic up: one object per topic keeps its hash computed once.
    pub, sub = pair
    read = _zmq_recv.MessageReceiver(sub)
    topics = [b"kv@10.0.0.1:5557@m", b"kv@10.0.0.2:5557@m", b"kv@10.0.0.1:5557@n"]
    sent = [[topic, (seq).to_bytes(8, "big"), b"x"] for seq in range(3) for topic in topics]
    for message in sent:
        pub.send_multipart(message)
    _arrive(sub)
    got = []
    for _ in sent:
        frames = read()
        assert frames is not None
        got.append(frames)
    assert got == sent
    firsts = {id(message[0]) for message in got}
    assert len(firsts) == len(topics)
    assert [message[0] for message in got[:3]] == topics


def _received(read: _zmq_recv.MessageReceiver) -> list[bytes]:
    frames = read()
    assert frames is not None
    return frames


def test_a_message_dropped_before_the_next_lends_its_list_and_seq_frame_to_it(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    # The drain drops each message before it receives the next: the list and the seq frame,
    # held by nobody else, are filled again instead of freed and made anew.
    pub, sub = pair
    read = _zmq_recv.MessageReceiver(sub)
    sent = [[b"kv", (seq).to_bytes(8, "big"), b"p%d" % seq * 40] for seq in range(3)]
    for message in sent:
        pub.send_multipart(message)
    _arrive(sub)
    first = _received(read)
    assert first == sent[0]
    hash(first[1])  # a hash kept in the seq frame must not outlive its bytes
    list_at, seq_at = id(first), id(first[1])
    del first
    # What was freed goes to the next objects of its kind: these take it, if it was freed.
    decoys = [[seq] for seq in range(100)], [b"%08d" % seq for seq in range(100)]
    second = _received(read)
    assert (id(second), id(second[1])) == (list_at, seq_at)
    assert second == sent[1]
    assert hash(second[1]) == hash(bytes(sent[1][1]))
    del decoys


def test_a_message_kept_by_the_caller_never_changes(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    pub, sub = pair
    read = _zmq_recv.MessageReceiver(sub)
    sent = [[b"kv", (seq).to_bytes(8, "big"), bytes([seq]) * 100] for seq in range(6)]
    sent += [[b"kv", b"short"], [b"kv", b"\x00" * 8, b"p", b"extra"], sent[0]]
    for message in sent:
        pub.send_multipart(message)
    _arrive(sub)
    kept_lists = [_received(read)]  # the whole message kept
    seq_kept = _received(read)[1]  # only its seq frame
    payload_kept = _received(read)[2]  # only its payload
    listed = _received(read)
    listed.append(b"grown by its caller")  # kept by nobody, but no longer three frames
    del listed
    rest = [_received(read) for _ in sent[4:]]
    assert kept_lists == [sent[0]]
    assert seq_kept == sent[1][1]
    assert payload_kept == sent[2][2]
    assert rest == sent[4:]
    assert read() is None
