from array import array

from _typeshed import ReadableBuffer

def content_ids(content: ReadableBuffer, granule: int) -> array[int]: ...
