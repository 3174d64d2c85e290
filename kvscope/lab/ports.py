"""Free TCP ports, for the lab's sockets and for the tests' (no vLLM here)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable


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


def free_port(exclude: Iterable[int] = ()) -> int:
    """A TCP port nothing listens on, chosen by the OS, and not one of `exclude`."""
    excluded = set(exclude)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in excluded and can_bind(port):
            return port
    raise RuntimeError("no free TCP port found")


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
