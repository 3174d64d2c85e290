"""Tokenizers for the tests, built with the `tokenizers` library itself (never downloaded)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

LAB_VOCAB = 32_000
"""The lab draws token ids below this (kvscope/lab/workload.py)."""


def word_tokenizer(path: Path, size: int = LAB_VOCAB) -> Path:
    """A word-level tokenizer whose id i is the word `w{i}`: every lab id maps to a word."""
    vocab = {f"w{i}": i for i in range(size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def trained_tokenizer(path: Path) -> Path:
    """A word-level tokenizer trained on a few words (ids 0 to 8)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(
        ["you are a helpful assistant", "answer in french"], trainer=trainer
    )
    tokenizer.save(str(path))
    return path


def words(ids: list[int]) -> str:
    """What `word_tokenizer` decodes `ids` to."""
    return " ".join(f"w{i}" for i in ids)
