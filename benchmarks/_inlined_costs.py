"""Self costs per C function of Cython's generated sources, inlined ones included, from a
callgrind profile: callgrind charges an inlined function's instructions to the function it was
inlined into, but keeps their source lines (the modules are built with `-g`). Each line's cost
goes to the function whose body holds that line in the generated .c file: `split_one`,
`same_all`, `granules_put`, `table_note` each get their own, wherever the compiler put them."""

from __future__ import annotations

import re
from bisect import bisect_right
from functools import cache
from pathlib import Path

_DEFINITION = re.compile(
    r"^(?:static |CYTHON_INLINE |__pyx_\w+ |PyObject |int |void |\w+ )+\*?"
    r"(__pyx_\w+)\("
)


@cache
def _functions(c_file: str) -> tuple[list[int], list[str]]:
    """(first line, name) of each function defined in `c_file` (its body starts there)."""
    starts, names = [], []
    try:
        lines = Path(c_file).read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    for number, line in enumerate(lines, 1):
        found = _DEFINITION.match(line)
        if found and not line.rstrip().endswith(";"):
            starts.append(number)
            names.append(_short(found.group(1)))
    return starts, names


def _short(name: str) -> str:
    """`__pyx_f_7kvscope_7storage_9_log_walk_split_one` -> `_log_walk.split_one` (Cython's
    mangling: each part of the module's path as its length and itself)."""
    found = re.match(r"__pyx_(?:f|pw|pf)_(.*)$", name)
    if found is None:
        return name
    rest, module = found.group(1), ""
    while (length := re.match(r"(\d+)", rest)) is not None:
        size = int(length.group(1))
        if size >= len(rest) - len(length.group(1)):  # a wrapper's number, then its name
            rest = rest[len(length.group(1)) :]
            break
        module = rest[len(length.group(1)) : len(length.group(1)) + size]
        rest = rest[len(length.group(1)) + size :].removeprefix("_")
    return f"{module}.{rest}"


def self_costs(out_file: str, root: str) -> dict[str, int]:
    """Self instructions per (generated .c file's) function in callgrind's `out_file`: lines of
    .c files under `root` only (the others are callgrind's own functions, not inlined ones)."""
    names: dict[str, str] = {}
    costs: dict[str, int] = {}
    current = ""  # the source file of the lines that follow
    fn_file = ""
    line = 0
    skip_next = False
    for raw in Path(out_file).read_text().splitlines():
        if not raw:
            continue
        head = raw[0]
        if head.isdigit() or head in "+-*":
            position, _, rest = raw.partition(" ")
            if position.startswith(("+", "-")):
                line += int(position)
            elif position != "*":
                line = int(position)
            if skip_next:  # a call's inclusive cost: the callee's, not this line's
                skip_next = False
                continue
            if current.endswith(".c") and current.startswith(root):
                cost = int(rest.split()[0]) if rest else 0
                starts, fns = _functions(current)
                at = bisect_right(starts, line) - 1
                name = fns[at] if at >= 0 else "?"
                key = f"{Path(current).stem}:{name}"
                costs[key] = costs.get(key, 0) + cost
            continue
        key, _, value = raw.partition("=")
        if key in ("cfi", "cfl"):
            ref, _, name = value.partition(" ")
            if name:
                names[ref] = name
        elif key in ("fl", "fi", "fe"):
            ref, _, name = value.partition(" ")
            if name:
                names[ref] = name
            current = names.get(ref, ref)
            if key == "fl":
                fn_file = current
        elif key == "fn":
            current = fn_file
        elif key == "calls":
            skip_next = True
    return costs
