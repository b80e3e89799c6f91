"""Data for the encoder-decoder: synthetic tasks generated on the fly, tab-separated pairs, a character
vocabulary with padding, start and end tokens, and padded ``(src, tgt)`` batches.

Tasks (the Annotated Transformer trains its first model on ``copy``): a source is ``n`` symbols drawn uniformly
from the first ``vocab`` of ``0-9a-z`` with ``n`` uniform in ``[min_len, max_len]``; the target is

* ``copy``: the source; ``reverse``: the source backwards; ``sort``: the source's symbols in order;
* ``add``: decimal addition, source ``"123+45"``, target ``"168"`` (operands of 1 to ``max_len`` digits).

Pairs files: one ``source<TAB>target`` pair per line (a line ends at ``\n`` or ``\r\n``; any other character is
data), both sides non-empty and at most :data:`MAX_PAIR_LENGTH` characters, read character by character.
Every problem raises :class:`~typed_transformer.data.DataError` with a one-line message naming the file and
the line.

Ids: 0 is padding, 1 is ``bos`` (the decoder's first input), 2 is ``eos``; characters follow in sorted order.
"""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor

from .data import DataError, load_text
from .shapecheck import shape_checked, typechecked
from .validation import check_token_ids

__all__ = ["BOS", "EOS", "MAX_PAIR_LENGTH", "PAD", "SYMBOLS", "TASKS", "Pair", "PairVocab", "Task", "encode_pairs",
           "make_pairs", "read_pairs", "split_pairs"]

PAD, BOS, EOS = 0, 1, 2
SPECIALS = 3
#: The symbols of the synthetic tasks; ``vocab`` takes the first ``vocab`` of them.
SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"
TASKS = ("copy", "reverse", "sort", "add")
Task = Literal["copy", "reverse", "sort", "add"]
Pair = tuple[str, str]
#: The most characters one side of a pair may have (``--max-len``'s bound too): a step attends over each side.
MAX_PAIR_LENGTH = 512


def _task_pair(task: str, rng: random.Random, min_len: int, max_len: int, vocab: int) -> Pair:
    if task == "add":
        a, b = (rng.randrange(10 ** rng.randint(min_len, max_len)) for _ in range(2))
        return f"{a}+{b}", str(a + b)
    source = "".join(rng.choice(SYMBOLS[:vocab]) for _ in range(rng.randint(min_len, max_len)))
    target = {"copy": source, "reverse": source[::-1], "sort": "".join(sorted(source))}[task]
    return source, target


def make_pairs(task: str, count: int, *, min_len: int, max_len: int, vocab: int = 10, seed: int = 0) -> list[Pair]:
    """``count`` pairs of a synthetic task, the same for the same arguments."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (choose {', '.join(TASKS)})")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"lengths: need 1 <= min_len <= max_len, got {min_len} and {max_len}")
    if not 2 <= vocab <= len(SYMBOLS):
        raise ValueError(f"vocab must be in [2, {len(SYMBOLS)}], got {vocab}")
    rng = random.Random(seed)
    return [_task_pair(task, rng, min_len, max_len, vocab) for _ in range(count)]


#: first lines that name the columns rather than hold a pair (refused: they would be trained on)
HEADERS = {("source", "target"), ("src", "tgt"), ("input", "output"), ("src", "trg")}


def read_pairs(path: str | Path) -> list[Pair]:
    """The ``source<TAB>target`` lines of a UTF-8 file (blank lines skipped). A line ends at ``\n`` (or
    ``\r\n``) only: every other character (form feed, U+0085, U+2028, ...) is data, as in any TSV reader. A side
    longer than :data:`MAX_PAIR_LENGTH` characters is refused (it would make one step attend over all of them), and so
    is a first line that names the columns (:data:`HEADERS`: ``source<TAB>target``, ...)."""
    pairs: list[Pair] = []
    for number, raw in enumerate(load_text(path).split("\n"), 1):
        line = raw.removesuffix("\r")
        if not line.strip(" \t"):
            continue
        fields = line.split("\t")
        if not pairs and tuple(f.strip().lower() for f in fields) in HEADERS:
            raise DataError(f"{path}: line {number} is a header ({line!r}), which would be trained on as a pair; "
                            f"remove it (the file is source<TAB>target lines only)")
        if len(fields) != 2:
            raise DataError(f"{path}: line {number} has {len(fields) - 1} tabs; each line is source<TAB>target")
        if not fields[0] or not fields[1]:
            side = "source" if not fields[0] else "target"
            raise DataError(f"{path}: line {number} has an empty {side}")
        for side, text in zip(("source", "target"), fields, strict=True):
            if len(text) > MAX_PAIR_LENGTH:
                raise DataError(f"{path}: line {number}'s {side} has {len(text):,} characters; at most "
                                f"{MAX_PAIR_LENGTH} per side (the longest sequence train-seq2seq trains on)")
        pairs.append((fields[0], fields[1]))
    if len(pairs) < 2:
        raise DataError(f"{path}: {len(pairs)} pair(s); training and a held-out split need at least 2")
    return pairs


def split_pairs(pairs: list[Pair], held_out: float, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """Shuffle with ``seed`` and hold out ``held_out`` of the pairs (at least one, at least one left)."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    order = list(pairs)
    random.Random(seed).shuffle(order)
    n = min(max(1, round(len(order) * held_out)), len(order) - 1)
    return order[n:], order[:n]


@shape_checked
@dataclass(frozen=True)
class PairVocab:
    """Characters <-> ids, shared by source and target, after the three special ids."""

    chars: str

    __shape_checked__ = ("decode",)

    @classmethod
    def from_pairs(cls, pairs: list[Pair], extra: str = "") -> "PairVocab":
        return cls("".join(sorted(set(extra).union(*(set(s) | set(t) for s, t in pairs)))))

    @property
    def size(self) -> int:
        return SPECIALS + len(self.chars)

    def encode(self, text: str) -> list[int]:
        index = {c: i + SPECIALS for i, c in enumerate(self.chars)}
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise DataError(f"characters not in the vocabulary: {''.join(unknown)!r} (it has {self.chars!r})")
        return [index[c] for c in text]

    def decode(self, ids: list[int] | Int[Tensor, " t"]) -> str:
        """The characters of ``ids``, stopping at the first ``eos`` and skipping ``bos`` and padding;
        :class:`~typed_transformer.TokenIdError` for an id outside the vocabulary."""
        values = ids.tolist() if isinstance(ids, Tensor) else ids
        check_token_ids("PairVocab.decode", "ids", values, self.size)
        out = []
        for i in values:
            if i == EOS:
                break
            if i >= SPECIALS:
                out.append(self.chars[i - SPECIALS])
        return "".join(out)


def encode_pairs(vocab: PairVocab, pairs: list[Pair], device: str | torch.device = "cpu"
                 ) -> tuple[Int[Tensor, "b s"], Int[Tensor, "b t"]]:
    """Sources padded with ``PAD``; targets as ``bos ... eos`` padded with ``PAD`` (the decoder reads
    ``tgt[:, :-1]`` and predicts ``tgt[:, 1:]``)."""
    sources = [vocab.encode(s) for s, _ in pairs]
    targets = [[BOS, *vocab.encode(t), EOS] for _, t in pairs]
    s = max(len(x) for x in sources)
    t = max(len(x) for x in targets)
    src = torch.tensor([x + [PAD] * (s - len(x)) for x in sources], dtype=torch.long, device=device)
    tgt = torch.tensor([x + [PAD] * (t - len(x)) for x in targets], dtype=torch.long, device=device)
    return src, tgt


encode_pairs = typechecked(encode_pairs)
