"""Free TCP ports, for the lab's sockets and for the tests' (no vLLM here)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterable
from pathlib import Path


def can_bind(port: int) -> bool:
    """Whether `port` can be bound on every interface now (as a publisher binds `tcp://*`).

    With SO_REUSEADDR, as libzmq sets it, so a port in TIME_WAIT counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
_handed_out: set[int] = set()
"""Ports this process was given: two calls never return the same one."""


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(exclude: Iterable[int] = ()) -> int:
    """A TCP port nothing listens on, not one of `exclude`, and not one this process was given.

    Drawn below the kernel's ephemeral range: a port from that range (what binding port 0 gives)
    can become the source port of any connection made before the caller binds it, and two draws
    in a row can give the same port: both made "Address already in use" in the tests."""
    excluded = set(exclude) | _handed_out
    high = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(LOWEST_PORT, high) if high > LOWEST_PORT + 1000 else _any_port()
        if port not in excluded and can_bind(port):
            _handed_out.add(port)
            return port
    raise RuntimeError("no free TCP port found")


def _any_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(length: int, exclude: Iterable[int] = ()) -> int:
    """A port p with p .. p+length-1 all free: vLLM adds the DP rank to the base port."""
    taken = set(exclude)
    for _ in range(200):
        base = free_port(taken)
        run = range(base, base + length)
        if base + length < 65536 and not taken & set(run) and all(map(can_bind, run)):
            return base
    raise RuntimeError(f"no run of {length} free ports found")


def wait_port_free(port: int, timeout: float = 5.0) -> None:
    """libzmq closes a listener asynchronously: wait until a closed socket's port is free."""
    deadline = time.monotonic() + timeout
    while not can_bind(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} still in use after {timeout} s")
        time.sleep(0.02)
