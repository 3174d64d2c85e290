"""The tests' and the lab's free ports: never one an outgoing connection may take meanwhile."""

from __future__ import annotations

import socket

from kvscope.lab.ports import _ephemeral_low, can_bind, free_port


def test_ports_are_drawn_below_the_ephemeral_range_and_never_twice() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(port < _ephemeral_low() for port in ports)
    assert all(map(can_bind, ports))


def test_a_port_someone_listens_on_is_never_given() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        assert not can_bind(taken)
        assert taken not in {free_port(exclude=()) for _ in range(300)}
