"""What the store cannot answer: kept apart from storage/history.py (which re-exports it) so
that the modules it reads through can raise it too."""

from __future__ import annotations


class NotInStore(LookupError):
    """The stream, seq or instant is not in the store (or outside what it retains)."""
