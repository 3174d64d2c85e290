from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"


def shared_capture(name: str) -> Path:
    """A capture from shared/captures beside the checkout; CI always has it, so never skip there."""
    path = SHARED_CAPTURES / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: CI must have shared/captures beside the checkout")
        pytest.skip(f"{path} not present (it lies beside the checkout in CI)")
    return path
