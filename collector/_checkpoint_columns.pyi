from array import array

from _typeshed import ReadableBuffer

def xor_linked_parents(
    parents: ReadableBuffer,
    hashes: ReadableBuffer,
    slots: ReadableBuffer,
    first_child: ReadableBuffer,
    next_sibling: ReadableBuffer,
) -> array[int]: ...
def intern_records(data: ReadableBuffer, record: int) -> tuple[array[int], array[int]]: ...
def expand_records(numbers: ReadableBuffer, records: ReadableBuffer, record: int) -> array[int]: ...
def by_slot(
    hashes: ReadableBuffer, slots: ReadableBuffer, n_slots: int
) -> tuple[array[int], bytes]: ...
def from_slots(
    hash_of_slot: ReadableBuffer, present: ReadableBuffer
) -> tuple[array[int], array[int]]: ...
def minus(a: ReadableBuffer, b: ReadableBuffer, inverse: bool = False) -> array[int]: ...
def previous_siblings(next_sibling: ReadableBuffer) -> array[int]: ...
def minus_parents(
    values: ReadableBuffer,
    slots: ReadableBuffer,
    first_child: ReadableBuffer,
    next_sibling: ReadableBuffer,
    inverse: bool = ...,
) -> array[int] | None: ...
