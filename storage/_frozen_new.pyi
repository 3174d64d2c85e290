from typing import Any, TypeVar

T = TypeVar("T")

def frozen_new(cls: type[T], names: tuple[str, ...], values: tuple[Any, ...]) -> T: ...
