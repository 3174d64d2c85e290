"""How a simulated engine is built and how long its steps take (pure Python, no vLLM)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    num_blocks: int = 400
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    topic: str = "kv-events"
    buffer_steps: int = 10_000
    """Batches the publisher keeps for replay."""
    step_base_s: float = 0.025
    """Simulated seconds every step takes (reading the weights, launching the step)."""
    step_per_token_s: float = 6e-5
    """Simulated seconds each scheduled token adds (prefill chunks and decode tokens alike)."""
    step_per_seq_s: float = 0.0
    """Simulated seconds each scheduled request adds (its attention over its own context)."""
    served_model_name: str = "lab"

    def __post_init__(self) -> None:
        if self.num_blocks < 2 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("num_blocks >= 2, block_size >= 1 and max_num_seqs >= 1")
        if min(self.step_base_s, self.step_per_token_s, self.step_per_seq_s) < 0:
            raise ValueError("step times must be >= 0")

    def step_time(self, scheduled_tokens: int, scheduled_requests: int = 0) -> float:
        """Simulated seconds one engine step takes (a step with nothing scheduled takes none)."""
        if scheduled_tokens == 0:
            return 0.0
        return (
            self.step_base_s
            + self.step_per_token_s * scheduled_tokens
            + self.step_per_seq_s * scheduled_requests
        )

    @property
    def step_time_model(self) -> str:
        model = f"{self.step_base_s:g} + {self.step_per_token_s:g} * scheduled_tokens"
        if self.step_per_seq_s:
            model += f" + {self.step_per_seq_s:g} * scheduled_requests"
        return model + " (sim s)"
