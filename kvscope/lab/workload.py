"""The lab's load model and reset schedule: pure Python, no vLLM.

Open-loop Poisson arrivals at a fixed rate; each prompt is one of `num_sys` shared system
prompts (Zipf-like popularity: prompt k is chosen with weight 1 / (k + 1) ** zipf_s) followed by
a random suffix, with a random output length. Optionally (all off by default) a request repeats
a recent prompt exactly (a twin), is cut to whole blocks (vLLM then recomputes its last block:
a second copy of a cached hash), or decodes greedily (its tokens follow from its last one, so
twins also write the same decode blocks). Everything is drawn from seeded generators, so a
(spec, stream) pair always yields the same requests.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class ResetMode(StrEnum):
    DEFAULT = "default"
    """`POST /reset_prefix_cache`: `Scheduler.reset_prefix_cache()`; fails while blocks are held."""
    PREEMPT = "preempt"
    """`reset_running_requests=true`: every running request is preempted, then the reset."""
    KEEP = "keep"
    """The proposed `keep_running_requests=true` (no vLLM release has it): the BlockPool's reset
    body without its all-blocks-free guard; running requests keep their blocks."""


@dataclass(frozen=True)
class ScheduledReset:
    at: float
    """Simulated seconds since the replica started."""
    mode: ResetMode


def parse_resets(spec: str) -> list[ScheduledReset]:
    """`45:default,90:preempt,135:keep` -> scheduled resets, sorted by time."""
    resets = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        at, sep, mode = part.partition(":")
        if not sep:
            raise ValueError(f"reset {part!r}: expected SECONDS:MODE, e.g. 45:default")
        try:
            when = float(at)
        except ValueError as exc:
            raise ValueError(f"reset {part!r}: {at!r} is not a number of seconds") from exc
        if when < 0:
            raise ValueError(f"reset {part!r}: the time must be >= 0")
        resets.append(ScheduledReset(when, parse_mode(mode)))
    return sorted(resets, key=lambda r: r.at)


def parse_mode(mode: str) -> ResetMode:
    try:
        return ResetMode(mode.strip().lower())
    except ValueError as exc:
        choices = ", ".join(m.value for m in ResetMode)
        raise ValueError(f"reset mode {mode!r}: expected one of {choices}") from exc


def periodic_resets(every: float, mode: ResetMode, until: float) -> list[ScheduledReset]:
    """A reset every `every` simulated seconds (at every, 2*every, ... < until)."""
    if every <= 0:
        raise ValueError("the reset period must be > 0")
    count = int(until / every)
    resets = [ScheduledReset(every * k, mode) for k in range(1, count + 1)]
    return [r for r in resets if r.at < until]


def parse_range(spec: str) -> tuple[int, int]:
    """`32,256` or `32-256` -> (32, 256); a single number N -> (N, N)."""
    for sep in (",", "-", ":"):
        if sep in spec:
            lo, _, hi = spec.partition(sep)
            break
    else:
        lo = hi = spec
    try:
        low, high = int(lo), int(hi)
    except ValueError as exc:
        raise ValueError(f"{spec!r}: expected LOW,HIGH (whole numbers)") from exc
    if low < 0 or high < low:
        raise ValueError(f"{spec!r}: expected 0 <= LOW <= HIGH")
    return low, high


@dataclass(frozen=True)
class WorkloadSpec:
    rate: float = 3.0
    """Requests per simulated second (Poisson arrivals)."""
    seed: int = 7
    num_sys: int = 4
    """Shared system prompts."""
    sys_prompt_len: tuple[int, int] = (96, 256)
    suffix_len: tuple[int, int] = (32, 256)
    out_len: tuple[int, int] = (16, 64)
    zipf_s: float = 1.0
    vocab: int = 32_000
    duration: float | None = None
    """No arrivals from this simulated second on (None: arrivals never stop)."""
    twin_prob: float = 0.0
    """Repeat one of the last `RECENT_PROMPTS` prompts exactly."""
    aligned_prob: float = 0.0
    """Cut the prompt to whole blocks of `block_size` tokens."""
    greedy_prob: float = 0.0
    """Decode greedily: each token a function of the one before."""
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.num_sys < 1:
            raise ValueError("num_sys must be >= 1")
        for name in ("sys_prompt_len", "suffix_len", "out_len"):
            low, high = getattr(self, name)
            if low < 0 or high < low:
                raise ValueError(f"{name}: expected 0 <= low <= high, got {(low, high)}")
        if self.sys_prompt_len[0] + self.suffix_len[0] < 1:
            raise ValueError("every prompt needs at least one token")
        if self.out_len[0] < 1:
            raise ValueError("out_len: every request generates at least one token")
        for name in ("twin_prob", "aligned_prob", "greedy_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")

    @property
    def max_request_tokens(self) -> int:
        return self.sys_prompt_len[1] + self.suffix_len[1] + self.out_len[1]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival: float
    """Simulated seconds since the replica started."""
    sys_index: int
    prompt: list[int] = field(repr=False)
    max_tokens: int
    greedy: bool = False


RECENT_PROMPTS = 64


class Workload:
    """The requests of one replica (`stream`), in arrival order, handed out by time (`due`)."""

    def __init__(self, spec: WorkloadSpec, stream: int = 0, prefix: str = "req") -> None:
        self.spec = spec
        self.stream = stream
        self.prefix = prefix
        prompts = random.Random(spec.seed)
        self.system_prompts = [
            [prompts.randrange(spec.vocab) for _ in range(prompts.randint(*spec.sys_prompt_len))]
            for _ in range(spec.num_sys)
        ]
        self.weights = [1.0 / (k + 1) ** spec.zipf_s for k in range(spec.num_sys)]
        self._rng = random.Random(f"kvscope-lab/{spec.seed}/{stream}")
        self._next_id = 0
        self._clock = 0.0
        self.recent_prompts: deque[tuple[int, list[int]]] = deque(maxlen=RECENT_PROMPTS)
        """(system prompt index, prompt) of the last requests drawn; twins repeat one."""
        self._pending: RequestSpec | None = self._draw()
        self.issued = 0

    @property
    def sys_prompt_lens(self) -> list[int]:
        return [len(p) for p in self.system_prompts]

    def _draw(self) -> RequestSpec | None:
        spec, rng = self.spec, self._rng
        self._clock += rng.expovariate(spec.rate)
        if spec.duration is not None and self._clock >= spec.duration:
            return None
        # Each optional draw only when its feature is on: the default stream stays as it was.
        if spec.twin_prob > 0 and self.recent_prompts and rng.random() < spec.twin_prob:
            sys_index, prompt = rng.choice(self.recent_prompts)
        else:
            sys_index = rng.choices(range(spec.num_sys), weights=self.weights)[0]
            suffix = [rng.randrange(spec.vocab) for _ in range(rng.randint(*spec.suffix_len))]
            prompt = self.system_prompts[sys_index] + suffix
            whole = len(prompt) // spec.block_size * spec.block_size
            if spec.aligned_prob > 0 and whole and rng.random() < spec.aligned_prob:
                prompt = prompt[:whole]
        self.recent_prompts.append((sys_index, prompt))
        request = RequestSpec(
            request_id=f"{self.prefix}-{self._next_id}",
            arrival=self._clock,
            sys_index=sys_index,
            prompt=list(prompt),
            max_tokens=rng.randint(*spec.out_len),
            greedy=spec.greedy_prob > 0 and rng.random() < spec.greedy_prob,
        )
        self._next_id += 1
        return request

    def next_arrival(self) -> float | None:
        """When the next request arrives (simulated s), None when no more will."""
        return None if self._pending is None else self._pending.arrival

    def due(self, now: float) -> Iterator[RequestSpec]:
        """Every request that has arrived by `now`, in order (each is handed out once)."""
        while self._pending is not None and self._pending.arrival <= now:
            request, self._pending = self._pending, self._draw()
            self.issued += 1
            yield request


def describe_resets(resets: Sequence[ScheduledReset]) -> str:
    return ",".join(f"{r.at:g}:{r.mode.value}" for r in resets)
