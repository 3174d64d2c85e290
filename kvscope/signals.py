"""SIGTERM and SIGINT as a clean stop (exit 0), for the long-running commands."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT, so both end the command cleanly (exit 0)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("kvscope").info("signal %d: stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
