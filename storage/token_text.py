"""Token ids as text, through a tokenizer the user names (`--tokenizer PATH` to a Hugging Face
`tokenizer.json`; the `tokenizers` library is the optional extra `kvscope[tokenizer]`).

Where a prefix group's first tokens are shown (GET /resets/{id}/prefixes, the page, `kvscope
report`), they are shown as text when a tokenizer was named, else as ids. An id the tokenizer
does not know (outside its vocabulary: the lab draws ids below 32,000 whatever the tokenizer)
is shown as `[#ID]` where it stands; the ids around it are decoded as runs, so a tokenizer's
decoder still joins its pieces (byte-level BPE, word pieces) as it would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

UNKNOWN_ID = "[#{}]"
"""How an id outside the tokenizer's vocabulary is shown."""


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded; the message says which path and why."""


class TokenText:
    """One tokenizer, loaded once; `text(ids)` is safe from several threads."""

    def __init__(self, path: Path | str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerError(
                f"--tokenizer {path}: needs the tokenizers library "
                "(pip install 'kvscope[tokenizer]')"
            ) from exc
        self.path = Path(path)
        try:
            self._tokenizer: Any = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises its own Exception for bad files
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            why = f"--tokenizer {self.path}: not a tokenizer.json ({first})"
            raise TokenizerError(why) from exc

    def known(self, token_id: int) -> bool:
        return self._tokenizer.id_to_token(token_id) is not None

    def text(self, ids: Sequence[int]) -> str:
        """`ids` decoded; special tokens are kept (they are in the cache like any other)."""
        parts: list[str] = []
        run: list[int] = []
        for token_id in ids:
            if 0 <= token_id < 2**32 and self.known(token_id):
                run.append(token_id)
                continue
            if run:
                parts.append(self._tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append(UNKNOWN_ID.format(token_id))
        if run:
            parts.append(self._tokenizer.decode(run, skip_special_tokens=False))
        return "".join(_spaced(parts))


def _spaced(parts: list[str]) -> list[str]:
    """Runs and unknown ids joined with a space where neither side has one."""
    out: list[str] = []
    for part in parts:
        if out and not out[-1].endswith(" ") and not part.startswith(" "):
            out.append(" ")
        out.append(part)
    return out


def load_token_text(path: Path | str | None) -> TokenText | None:
    """The tokenizer at `path`, or None when none was named."""
    return None if path is None or str(path) == "" else TokenText(path)
