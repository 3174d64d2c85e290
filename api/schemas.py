"""Response and request bodies (they are the OpenAPI document's schemas)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field

from kvscope.api.schemas_lease import LeaseInfo

if TYPE_CHECKING:
    from kvscope.collector.block_table import TableStats
    from kvscope.collector.types import TableKey

Hash = int | str
"""A block hash: vLLM's int form, or hex for publishers that send bytes hashes."""


class TableStatus(BaseModel):
    medium: str
    group: int
    blocks: int
    copies: int
    hittable: int
    orphans: int


def table_statuses(stats: Mapping[TableKey, TableStats]) -> list[TableStatus]:
    """Each table's figures, by tier then KV group."""
    return [
        TableStatus(
            medium=key.medium,
            group=key.group,
            blocks=s.blocks,
            copies=s.copies,
            hittable=s.hittable,
            orphans=s.orphans,
        )
        for key, s in sorted(stats.items(), key=lambda kv: (kv[0].medium, kv[0].group))
    ]


class DegradedInfo(BaseModel):
    reason: str
    from_seq: int
    to_seq: int | None
    since: float


class RankStatus(BaseModel):
    rank: int
    source: Literal["live", "store"]
    connected: bool | None = Field(description="None when only the store is known.")
    silent: bool | None
    engine: Literal["vllm", "sglang"] | None = Field(
        default=None,
        description="The publishing engine: configured, or told by the stream's batches "
        "(SGLang's carry cache_salt and session_id). None until a batch stores a block.",
    )
    gone: bool | None = Field(
        default=None,
        description="A fleet's publisher silent past gone_after_s: its map and history are "
        "kept, and it is followed again when it speaks. None when only the store is known.",
    )
    lease: LeaseInfo | None = None
    epoch: int
    last_seq: int | None
    last_batch_ts: float | None
    age_s: float | None = Field(
        description="Seconds since the last batch arrived, on the collector's clock (for a "
        "store-only API: since it was stored). An idle engine publishes nothing: a growing age "
        "is not a fault by itself."
    )
    engine_clock_offset_s: float | None = Field(
        description="The last batch's arrival time minus its stamp: the engine clock's offset "
        "from the collector's, plus transit time. Large for a recording or a simulated clock."
    )
    degraded: DegradedInfo | None
    degraded_intervals: int
    tail_unverified: bool | None = Field(
        default=None,
        description="Silent with no replay to show that no batch was lost at the end of the "
        "stream (there is no replay socket, or it is being asked): the map may lack its last "
        "changes. None when only the store is known.",
    )
    ingest_errors: int | None = Field(
        default=None,
        description="Messages whose handling failed (each marked the map unknown); by stage "
        "and kind in kvscope_ingest_errors_total.",
    )
    gaps: int | None
    replays_ok: int | None
    replays_failed: int | None
    restarts: int | None
    blocks: int
    hittable: int
    orphans: int
    tables: list[TableStatus]


class UnavailableRank(BaseModel):
    rank: int
    reason: str


class ReplicaStatus(BaseModel):
    replica: str
    ranks: list[RankStatus]
    unavailable: list[UnavailableRank] = Field(
        default_factory=list,
        description="Ranks known only to the store, left out while the store does not answer.",
    )


class Block(BaseModel):
    hash: Hash
    medium: str
    group: int
    count: int
    parent: Hash | None
    hittable: bool
    block_size: int
    token_ids: list[int] | None
    lora_name: str | None
    first_stored: float
    last_stored: float


class BlockPage(BaseModel):
    replica: str
    rank: int
    source: Literal["live", "store"]
    epoch: int
    seq: int | None
    ts: float | None
    unknown_because: list[str]
    items: list[Block]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


# Strict: a JSON true, "1" or 1.0 is no token id. The lookup keeps them as unsigned 32-bit.
TokenId = Annotated[int, Field(ge=0, lt=2**32, strict=True)]
MAX_LOOKUP_TOKENS = 1_000_000
"""A prompt's length bound: a longer list is refused (422) before any lookup."""


class LookupRequest(BaseModel):
    token_ids: list[TokenId] = Field(
        max_length=MAX_LOOKUP_TOKENS,
        description=f"The request's prompt tokens: integers in [0, 2**32), at most "
        f"{MAX_LOOKUP_TOKENS}.",
    )
    lora_name: str | None = Field(default=None, max_length=1024)


class LookupMatch(BaseModel):
    replica: str
    rank: int
    medium: str
    group: int
    blocks: int
    tokens: int
    hittable: bool = Field(description="Found from block 0 along cached parents: a router's hit.")


class UnavailableStream(BaseModel):
    replica: str
    rank: int
    reason: str


class LookupResponse(BaseModel):
    matches: list[LookupMatch]
    best: LookupMatch | None
    unavailable: list[UnavailableStream] = Field(
        default_factory=list,
        description="Streams not searched: known only to the store, which does not answer.",
    )


class RecoveryPointOut(BaseModel):
    offset_s: float
    blocks: int
    hittable: int
    orphans: int
    share_blocks_back: float
    share_tokens_back: float


class ResetRequestOut(BaseModel):
    id: int
    replica: str
    requested_at: float
    requested_by: str
    mode: str
    external: bool
    outcome: str
    http_status: int | None
    detail: str | None
    recorded: bool = Field(
        default=True,
        description="False when the store could not record the request (it was still sent; "
        "`id` is then 0).",
    )


class ResetOut(BaseModel):
    id: int
    replica: str
    rank: int
    epoch: int
    seq: int
    ts: float
    reason: str
    mode: str | None = Field(description="default / preempt / keep, when asked for via kvscope.")
    degraded: bool
    before_blocks: int
    before_hittable: int
    before_orphans: int
    before_tokens: int
    t50_s: float | None
    t90_s: float | None
    peak_orphans: int | None
    recovery_complete: bool = Field(
        description="Every offset of the recovery window (1 to 300 s) was reached. False while "
        "the recovery is followed (the points reached so far are stored as they are) or when a "
        "later reset or the stream's end cut it short: the recovery is partial."
    )
    recovery_until_ts: float | None = Field(
        description="Engine time of the last batch the stored recovery was followed to (as of "
        "its last write: a point reached, t50/t90 known, the window's end or the writer's close)."
    )
    offsets_reached: list[float] = Field(
        description="Offsets (s after the reset) with a stored recovery point, in order."
    )
    request: ResetRequestOut | None


class ResetDetail(ResetOut):
    before_tables: list[TableStatus]
    recovery: list[RecoveryPointOut]


class Health(BaseModel):
    status: Literal["ok"]
    detail: str = ""


class Prefix(BaseModel):
    blocks: int
    tokens: int
    first_tokens: list[int] | None = Field(description="The first block's tokens.")
    leaf: Hash


class TableShape(BaseModel):
    medium: str
    group: int
    blocks: int
    roots: int
    orphan_chains: int
    orphan_chain_blocks: int
    chain_lengths: dict[str, int] = Field(
        description="Leaves by prefix length in blocks (power-of-two buckets: '1', '2-3', ...)."
    )
    largest_prefixes: list[Prefix]


class ShapeResponse(BaseModel):
    replica: str
    rank: int
    source: Literal["live", "store"]
    seq: int | None
    ts: float | None
    tables: list[TableShape]


class DiffResponse(BaseModel):
    replica: str
    rank: int
    from_seq: int | None
    to_seq: int | None
    stored: int
    removed: int
    kept: int
    stored_hashes: list[Hash]
    removed_hashes: list[Hash]


class SeriesPoint(BaseModel):
    t: float
    value: float


class Series(BaseModel):
    rank: int
    medium: str
    group: int
    points: list[SeriesPoint]


class SeriesResponse(BaseModel):
    replica: str
    metric: str
    step: int
    series: list[Series]


PrefixStatus = Literal["back at +1 s", "back at +10 s", "back at +60 s", "back later", "not back"]


class PrefixGroupPoint(BaseModel):
    offset_s: float
    blocks_back: int = Field(description="The group's blocks cached again.")
    hittable_back: int = Field(description="The group's blocks hittable again.")
    shared_back: int = Field(description="The group's shared blocks hittable again.")


class PrefixGroupOut(BaseModel):
    medium: str
    group: int
    root: Hash = Field(description="The group's root: a block whose parent was not cached.")
    root_text: str = Field(
        description="`root` as a string: JavaScript's numbers hold 53 bits, vLLM's hashes 64."
    )
    orphan_root: bool = Field(description="The root named a parent that was not cached.")
    first_tokens: list[int] | None = Field(description="The root's first 16 token ids.")
    first_text: str | None = Field(
        description="`first_tokens` as text, through the tokenizer named with --tokenizer "
        "(null without one); an id outside its vocabulary reads `[#ID]`."
    )
    blocks: int
    tokens: int = Field(description="blocks x block size.")
    shared_blocks: int = Field(
        description="Blocks two or more cached prefixes went through (0: a single chain)."
    )
    points: list[PrefixGroupPoint] = Field(description="One per offset reached, in order.")
    back_at_s: float | None = Field(
        description="The first offset reached at which 90 % of the shared blocks (of a single "
        "chain: of its blocks) were hittable again."
    )
    status: PrefixStatus
    orphans_left: int = Field(description="Orphans the reset left under this group's blocks.")


class ResetOrphanOut(BaseModel):
    medium: str
    group: int
    hash: Hash
    parent: Hash
    stored_ts: float
    rejoined_ts: float | None = Field(description="Its parent was cached again (engine time).")
    removed_ts: float | None = Field(description="It was removed before it rejoined.")
    group_root: Hash | None = Field(description="The group its parent belonged to before.")


class EvictedOrphanOut(BaseModel):
    medium: str
    group: int
    hash: Hash
    parent: Hash
    orphaned_ts: float = Field(description="Its parent was removed (engine time).")
    rejoined_ts: float | None = Field(description="Its parent was cached again (engine time).")
    removed_ts: float | None = Field(description="It was removed before it rejoined.")
    group_root: Hash | None = Field(description="The group its parent belonged to before.")


class ResetPrefixesPage(BaseModel):
    reset_id: int
    replica: str
    rank: int
    ts: float
    offsets_reached: list[float]
    recovery_complete: bool
    back_share: float
    groups_total: int
    blocks_total: int
    tokens_total: int
    tokens_by_status: dict[str, int] = Field(description="Every group's tokens, by status.")
    items: list[PrefixGroupOut] = Field(description="Largest first (tokens, then blocks).")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")
    orphans_total: int
    orphans: list[ResetOrphanOut] = Field(
        description="The orphans the reset left (blocks stored after the clear whose parent "
        "was not cached), in the order they were stored; the first 1000."
    )
    evicted_orphans_total: int
    evicted_orphans: list[EvictedOrphanOut] = Field(
        description="Not the reset's: blocks stored after the clear under a cached parent that "
        "was evicted later, in the order they were orphaned; the first 1000."
    )
    followed_until_ts: float = Field(
        description="The last batch the orphans were followed through (to the last offset)."
    )
    unknown_because: list[str] = Field(
        description="Degraded or incomplete intervals covering the map just after the clear: "
        "the counts may be short."
    )
