"""Issue 12's fuzz harness: hostile frames through live sockets into `kvscope serve`.

- `msgpack_raw`: a msgpack writer that can also write what no encoder would (invalid UTF-8,
  headers that lie about their length, ints at the edges, float32 NaN).
- `structural`: structurally hostile batches (every field of every event mistyped, nil, huge).
- `frames`: every class of hostile message, deterministic from a seed, and the plan that
  interleaves them with a real capture.
- `live`: the run: `kvscope serve` as a subprocess, two XPUB publishers, the checks.

`scripts/fuzz.py` is the command line; `tests/test_fuzz_live.py` a short run of it.
"""
