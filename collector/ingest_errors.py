"""What a stream's ingest says about input it refused and messages whose handling failed:
counted (`StreamCounters`), and logged at most once per kind per interval, with enough to find
the message again (the stream, its seq, the payload's first bytes)."""

from __future__ import annotations

from kvscope.collector.errors import MalformedKind
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.replay import SEQ_BYTES
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import StreamId


class IngestErrors:
    def __init__(self, stream: StreamId, counters: StreamCounters, log: RateLimitedLog) -> None:
        self.stream = stream
        self.counters = counters
        self.log = log

    def malformed(self, kind: MalformedKind, seq: int | None, detail: str) -> None:
        """Input refused by a rule (the decoder's, a limit, the framing)."""
        self.counters.malformed[kind.value] += 1
        self.log.warning(
            f"{kind}:{self.stream}", "%s: refused %s at seq %s: %s", self.stream, kind, seq, detail
        )

    def message_failed(self, stage: str, exc: Exception, frames: list[bytes] | None) -> int | None:
        """An exception escaped one message's handling (a bug here or in the sink): counted by
        stage and kind, logged with its traceback; the message's seq, if it had one."""
        kind = type(exc).__name__
        self.counters.ingest_errors[(stage, kind)] += 1
        # Live [topic, seq, payload] and replay [.., seq, payload]: the seq is second to last.
        seq_frame = frames[-2] if frames is not None and len(frames) >= 2 else b""
        seq = int.from_bytes(seq_frame, "big") if len(seq_frame) == SEQ_BYTES else None
        head = frames[-1][:32].hex() if frames else ""
        self.log.warning(
            f"error:{stage}:{kind}:{self.stream}",
            "%s: %s message failed at seq %s (%s: %s; payload %s...): map marked unknown",
            self.stream,
            stage,
            seq,
            kind,
            exc,
            head,
            exc_info=exc,
        )
        return seq

    def socket_failed(self, role: str, exc: Exception) -> None:
        """A socket of this stream failed (the loop goes on with the others)."""
        self.counters.ingest_errors[(f"socket_{role}", type(exc).__name__)] += 1
        self.log.warning(
            f"socket:{role}:{self.stream}", "%s: %s socket failed: %s", self.stream, role, exc
        )

    def sink_failed(self, stage: str, exc: Exception) -> None:
        """The sink raised on something that is no batch (a connection change)."""
        self.counters.ingest_errors[(stage, type(exc).__name__)] += 1
        self.log.warning(
            f"sink:{stage}:{self.stream}",
            "%s: the sink failed on %s: %s",
            self.stream,
            stage,
            exc,
            exc_info=exc,
        )
