"""A rank's lease in GET /replicas (collectors that share streams: storage/leases.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LeaseInfo(BaseModel):
    """Collectors that share streams (collect --lease): who writes this one. Absent (null)
    without leases."""

    owner: str | None = Field(description="The collector holding it (host/pid/nonce); None: free.")
    token: int = Field(description="The lease's fencing token: one more at every grant.")
    live: bool = Field(description="The holder's heartbeat is current: the lease holds.")
