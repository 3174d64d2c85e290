from kvscope.collector._replay import FusedApply
from kvscope.collector.fleet_router import Route
from kvscope.collector.types import Batch

class RouteStream: ...

class RouteTable:
    _ranks: dict[bytes, dict[int, Route]]
    _reader: FusedApply | None
    _max_block_size: int
    def _add_route(self, topic: bytes, rank: int, route: Route) -> None: ...
    def _drop_route(self, topic: bytes, rank: int) -> None: ...
    def route_batch(
        self, frames: list[bytes]
    ) -> tuple[Route | None, Batch | FusedApply | None]: ...
    def _route_rest(
        self, frames: list[bytes], rank: int, read: FusedApply | None
    ) -> tuple[Route | None, Batch | FusedApply | None]: ...
