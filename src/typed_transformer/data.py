"""Text data for the character-level GPT: a character tokenizer (the original tutorial's), a default corpus, the 90/10
train/validation split and random ``(b, t)`` batches from a seeded generator.

Every problem with the input raises :class:`DataError` with a one-line message naming the file and what
was wrong with it; the command line prints that line and exits with code 2.
"""

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from ._files import NotARegularFile, require_regular_file
from .shapecheck import shape_checked, typechecked
from .validation import check_token_ids

__all__ = ["CharTokenizer", "DataError", "TextData", "default_corpus", "get_batch", "left_pad", "load_text",
           "read_prompts"]

#: Size of the default corpus, in characters (the files are taken whole, so it ends a little above this).
DEFAULT_CORPUS_CHARS = 1_000_000


class DataError(ValueError):
    """The training text or a prompt cannot be used; the message is one line."""


def load_text(path: str | Path) -> str:
    """Read a UTF-8 text file, refusing missing, unreadable, binary, non-UTF-8 and empty files."""
    path = Path(path)
    try:
        raw = require_regular_file(path, "the text").read_bytes()  # never a FIFO or a device (/dev/zero)
    except NotARegularFile as err:
        if path.is_dir():  # the message docs/reliability.md shows
            raise DataError(f"{path}: is a directory, not a text file") from None
        raise DataError(str(err)) from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a text file") from None
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror})") from None
    if b"\x00" in raw:
        raise DataError(f"{path}: looks like a binary file (it contains NUL bytes), not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})") from None
    if not text:
        raise DataError(f"{path}: is empty")
    return text


def default_corpus(chars: int = DEFAULT_CORPUS_CHARS) -> tuple[str, str]:
    """About ``chars`` characters of the running Python's own standard-library source.

    Present on every machine with no download, and nothing we have to ship: the ``*.py`` files directly in
    the stdlib directory, sorted by name, taken whole until the total reaches ``chars``. Returns the text and
    a description of where it came from.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    names: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        names.append(path.name)
        total += len(text)
        if total >= chars:
            break
    if not parts:
        raise DataError(f"{stdlib}: no standard-library source files found for the default corpus")
    return "".join(parts), f"{len(names)} standard-library files {names[0]}..{names[-1]} from {stdlib}"


@shape_checked
class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of the training text."""

    __shape_checked__ = ("decode",)

    def __init__(self, chars: str) -> None:
        if not chars:
            raise DataError("the vocabulary is empty")
        if len(set(chars)) != len(chars):
            raise DataError("the vocabulary has repeated characters")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; DataError naming every character that is not in the vocabulary."""
        try:
            return [self._index[c] for c in text]
        except KeyError:
            unknown = sorted({c for c in text if c not in self._index})
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise DataError(f"characters not in the vocabulary: {shown}{more}") from None

    def decode(self, ids: list[int] | Int[Tensor, " t"]) -> str:
        """The text of ``ids``; :class:`~typed_transformer.TokenIdError` for an id outside the vocabulary."""
        values = ids.tolist() if isinstance(ids, Tensor) else ids
        check_token_ids("CharTokenizer.decode", "ids", values, len(self.chars))
        return "".join(self.chars[i] for i in values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)


@shape_checked
@dataclass
class TextData:
    """A tokenized text split 90/10 into training and validation ids (split on characters, as nanoGPT)."""

    tokenizer: CharTokenizer
    train: Int[Tensor, " n"]
    val: Int[Tensor, " m"]

    __shape_checked__ = ("__init__",)

    @classmethod
    def from_text(cls, text: str, block_size: int, *, tokenizer: CharTokenizer | None = None,
                  val_fraction: float = 0.1, source: str = "the text") -> "TextData":
        """Tokenize and split; both splits must hold at least ``block_size + 1`` tokens."""
        if not text:
            raise DataError(f"{source}: is empty")
        tokenizer = tokenizer or CharTokenizer.from_text(text)
        ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
        n_train = int(len(ids) * (1.0 - val_fraction))
        train, val = ids[:n_train], ids[n_train:]
        need = block_size + 1
        if len(train) < need or len(val) < need:
            raise DataError(f"{source}: {len(text)} characters is too short for block_size={block_size}: "
                            f"each split needs at least {need} characters (train has {len(train)}, "
                            f"validation {len(val)}); use a longer text or a smaller --block-size")
        return cls(tokenizer, train, val)


def get_batch(data: Int[Tensor, " n"], batch_size: int, block_size: int, generator: torch.Generator
              ) -> tuple[Int[Tensor, "{batch_size} {block_size}"], Int[Tensor, "{batch_size} {block_size}"]]:
    """``batch_size`` random windows of ``block_size`` tokens and the same windows shifted by one."""
    starts = torch.randint(len(data) - block_size, (batch_size, 1), generator=generator)
    positions = starts + torch.arange(block_size)
    return data[positions], data[positions + 1]


get_batch = typechecked(get_batch)


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a UTF-8 file, one per line; blank lines are skipped (:func:`load_text`'s checks apply)."""
    prompts = [line for line in load_text(path).splitlines() if line.strip()]
    if not prompts:
        raise DataError(f"{path}: no prompt (every line is blank)")
    return prompts


def left_pad(rows: list[list[int]], *, pad: int = 0, device: str | torch.device = "cpu"
             ) -> tuple[Int[Tensor, "b t"], Int[Tensor, " b"]]:
    """Token id lists as one left-padded ``(b, max length)`` batch and their lengths, the form
    :meth:`GPT.generate <typed_transformer.gpt.GPT.generate>` takes prompts of different lengths in."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], dtype=torch.long, device=device)
    return ids, torch.tensor([len(row) for row in rows], dtype=torch.long, device=device)


left_pad = typechecked(left_pad)
