"""A benchmark's child process run under valgrind's callgrind, and what callgrind counted: the
instruction benchmarks' one runner (`*_instructions.py`).

The child counts only what it runs inside `deque_init`: it wraps the code it measures in
`deque(map(step, work), maxlen=0)`, and callgrind is told to count inside that call alone
(`--collect-atstart=no --toggle-collect=deque_init`). Its hash seed is fixed, so that two runs
of the same code count the same.

Calls are another matter: callgrind counts a call even while it is not collecting, and writes
the count with the caller's arc wherever that arc also cost something inside the window. A
count of calls from such a run holds every call made outside (a store's migrations: their
statements, each fetched row's columns) beside those inside. A child that counts calls
(`run_child(..., marked=True)`) collects from its start and calls `mark()` at the window's
two ends instead: callgrind dumps its counts, calls included, and starts again from zero at
each (`--dump-before`), so the window's dump (`window_file`) holds the window alone.
"""

from __future__ import annotations

import binascii
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from _ingest_stream import StreamStats

COUNTED = "deque_init"
"""The function whose calls are counted (and nothing outside them)."""
MARK = "binascii_crc_hqx"
"""The C function `mark()` calls, at a marked window's two ends: nothing kvscope runs (nor
SQLAlchemy, alembic, sqlite3, zstd) calls it."""
GIL_FREE = re.compile(
    r"\s([\d,]+) \(.*?:(compress_from_datasources|ZstdCompressor_compress"
    r"|__pyx_pw_\w+_(?:log_columns_\d+(?:split|join|joins_back|pack_runs)|log_planes_\d+token_planes"
    r"|token_granules_\d+RunTable_\d+note)|sqlite3_step) "
)
"""callgrind_annotate's inclusive lines of the calls that let go of the GIL around their work
(their setup, holding it, is counted in: a little more than the GIL-free part)."""


def need_valgrind(script: str) -> None:
    if shutil.which("valgrind") is None:
        sys.exit(f"{script} counts with valgrind's callgrind: apt-get install valgrind")


def store_stream(
    script: str, events: int, seed: int, cached: int
) -> tuple[list[bytes], StreamStats]:
    """The stream instruction benchmark `script` counts on: benchmarks/store.py's, of `events`
    block-events and `cached` blocks when full. `script` stops first where valgrind is missing."""
    need_valgrind(script)
    from _ingest_stream import make_stream  # the parent's alone: the children never import it

    return make_stream(events, seed, cached, 10**12)


def write_payloads(payloads: list[bytes], folder: str) -> str:
    """`payloads` written to a file in `folder`, for the child to read back: its path."""
    path = Path(folder) / "payloads.msgpack"
    path.write_bytes(msgspec.msgpack.encode(payloads))
    return str(path)


def read_payloads(path: str) -> list[bytes]:
    """In the child: the payloads `write_payloads` wrote."""
    payloads: list[bytes] = msgspec.msgpack.decode(Path(path).read_bytes())
    return payloads


def run_child(
    command: Sequence[str], out_file: str | None, flags: Sequence[str] = (), marked: bool = False
) -> str:
    """Run `command` (the benchmark itself, as its child) under callgrind, counting only inside
    `COUNTED`, its profile written to `out_file` (with `flags` added to valgrind's); with
    `out_file` None, without valgrind. `marked`: the child calls `mark()` at its window's ends,
    and the window's profile, calls counted exactly, is `window_file(out_file)`. Its stderr; if
    it fails, the benchmark exits with its stderr's tail."""
    if out_file is not None:
        window = [f"--dump-before={MARK}"]
        if not marked:
            window = ["--collect-atstart=no", f"--toggle-collect={COUNTED}"]
        command = [
            "valgrind",
            "--tool=callgrind",
            *window,
            *flags,
            f"--callgrind-out-file={out_file}",
            *command,
        ]
    run = subprocess.run(
        command,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode:
        sys.exit(run.stderr[-4000:])
    return run.stderr


def collected(stderr: str) -> int:
    """The instructions counted, as callgrind's summary in the child's stderr gives them."""
    found = re.search(r"Collected : (\d+)", stderr)
    assert found, stderr
    return int(found.group(1))


def mark() -> None:
    """In a marked child (`run_child(..., marked=True)`): one end of the window counted."""
    binascii.crc_hqx(b"", 0)


def window_file(out_file: str) -> str:
    """A marked child's profile of its window: callgrind's second dump (the first holds all
    before it, the last all after)."""
    return f"{out_file}.2"


def window_collected(out_file: str) -> int:
    """The instructions a marked child's window counted."""
    found = re.search(r"^summary: (\d+)$", Path(window_file(out_file)).read_text(), re.M)
    assert found, out_file
    return int(found.group(1))


def calls_to(out_file: str, callee: str) -> dict[str, int]:
    """The calls of `callee` in callgrind's `out_file`, per calling function (exact in a marked
    window's file only: see the module's docstring); a function without a symbol (a stripped
    library's) is named by its address and its library's file."""
    names: dict[str, str] = {}
    each: dict[str, int] = {}
    caller = target = library = ""
    for line in Path(out_file).read_text().splitlines():
        key, _, rest = line.partition("=")
        if key in ("fn", "cfn", "ob", "cob"):
            ref, _, name = rest.partition(" ")  # "(id) name" the first time, "(id)" after
            if name:
                names[key[-2:] + ref] = name
            if key == "ob":
                library = names.get("ob" + ref, "")
            elif key == "fn":
                caller = names.get("fn" + ref, ref)
                if caller.startswith("0x"):
                    caller = f"{caller} in {Path(library).parent.name}/{Path(library).name}"
            else:
                target = names.get("fn" + ref, ref)
        elif key == "calls" and target == callee:
            each[caller] = each.get(caller, 0) + int(rest.split()[0])
    return each


def say_source(module_file: str) -> None:
    """In the child: which kvscope it runs (the parent reads it back with `source`)."""
    print(f"kvscope from {module_file}", file=sys.stderr)


def source(stderr: str) -> str:
    found = re.search(r"kvscope from (\S+)", stderr)
    assert found, stderr
    return found.group(1)


def annotated(out_file: str, inclusive: bool = True, threshold: int = 100) -> str:
    """callgrind_annotate's report of `out_file`: each function's count, its callees' included
    (`inclusive`) or not, the functions that make up `threshold` percent of the total."""
    command = ["callgrind_annotate", f"--threshold={threshold}", out_file]
    if inclusive:
        command.insert(1, "--inclusive=yes")
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def count(report: str, name: str) -> int:
    """The count an `annotated` report gives `name` (a function, or "PROGRAM TOTALS")."""
    found = re.search(rf"^\s*([\d,]+)\s.*{name}\b", report, re.M)
    assert found, f"{name} not in callgrind's report: {report[:2000]}"
    return int(found.group(1).replace(",", ""))


def gil_free(out_file: str) -> dict[str, int]:
    """Instructions inside each call that lets go of the GIL, in callgrind's `out_file`: zstd,
    the log's split, join and join-back walks, token planes, content noting, sqlite."""
    each: dict[str, int] = {}
    for n, function in GIL_FREE.findall(annotated(out_file)):
        # A function's line with its whole inclusive count is its largest (others are parts).
        each[function] = max(each.get(function, 0), int(n.replace(",", "")))
    named: dict[str, int] = {}
    for function, n in each.items():
        name = "zstd" if "ompress" in function else re.sub(r".*_\d+", "", function)
        name = "sqlite" if "sqlite" in function else name
        named[name] = named.get(name, 0) + n
    return named
