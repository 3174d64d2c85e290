from collections.abc import Callable
from typing import Any

from kvscope.collector.sockets import MessageReader
from kvscope.collector.stream_table import StreamTable
from kvscope.collector.types import StreamId

class DrainLoop:
    def __init__(
        self,
        read: MessageReader,
        route: Callable[[list[bytes]], tuple[Any, Any]],
        now: Callable[[], float],
        streams: StreamTable[Any],
        gone: set[StreamId],
        drain: Any,
    ) -> None: ...
    def __call__(self, ignored: object = None) -> bool: ...
    def run(self, limit: int) -> bool: ...
