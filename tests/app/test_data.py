"""Text data: the character tokenizer, load_text's refusals, the 90/10 split and random batches."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from typed_transformer import ShapeError, TokenIdError
from typed_transformer.data import CharTokenizer, DataError, TextData, default_corpus, get_batch, load_text

# ---------------------------------------------------------------------------------------------------
# CharTokenizer
# ---------------------------------------------------------------------------------------------------


def test_vocabulary_is_the_sorted_set_of_characters() -> None:
    text = "hello, wörld!\nhello"
    tok = CharTokenizer.from_text(text)
    assert tok.chars == "\n !,dehlorwö"
    assert tok.vocab_size == 12
    assert tok.encode("lo") == [tok.chars.index("l"), tok.chars.index("o")]
    assert tok.encode("\n !") == [0, 1, 2]
    assert tok.encode("") == []


def test_encode_decode_round_trip() -> None:
    text = "To be, or not to be: ça, c'est la question.\n"
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(tok.chars[i] == c for i, c in zip(ids, text, strict=True))
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text


def test_encoding_unknown_characters_names_every_one_of_them() -> None:
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(DataError) as info:
        tok.encode("abxcyx\u00e9")
    assert info.type is DataError
    assert str(info.value) == "characters not in the vocabulary: 'x' (U+0078), 'y' (U+0079), 'é' (U+00E9)"
    assert len(str(info.value).splitlines()) == 1


def test_many_unknown_characters_are_summarised() -> None:
    tok = CharTokenizer.from_text("a")
    with pytest.raises(DataError, match=r"'k' \(U\+006B\) and 2 more$"):
        tok.encode("bcdefghijklm")


def test_decode_refuses_ids_outside_the_vocabulary() -> None:
    tok = CharTokenizer.from_text("abc")
    for bad, named in (([3], 3), ([-1], -1), ([0, 1, 7], 7), (torch.tensor([2, 5]), 5)):
        with pytest.raises(TokenIdError) as info:
            tok.decode(bad)
        assert str(info.value) == f"CharTokenizer.decode: ids holds token id {named}, outside the vocabulary 0..2"


def test_tokenizer_refuses_empty_or_repeated_vocabularies() -> None:
    with pytest.raises(DataError, match="the vocabulary is empty"):
        CharTokenizer("")
    with pytest.raises(DataError, match="repeated characters"):
        CharTokenizer("abca")


def test_tokenizers_compare_by_vocabulary() -> None:
    assert CharTokenizer.from_text("cab") == CharTokenizer("abc")
    assert hash(CharTokenizer.from_text("cab")) == hash(CharTokenizer("abc"))
    assert CharTokenizer("abc") != CharTokenizer("abd")
    assert CharTokenizer("abc") != "abc"


# ---------------------------------------------------------------------------------------------------
# load_text
# ---------------------------------------------------------------------------------------------------


def test_load_text_reads_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes("naïve café\nline 2\n".encode())
    assert load_text(path) == "naïve café\nline 2\n"
    assert load_text(str(path)) == "naïve café\nline 2\n"


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nope.txt"


def _directory(tmp_path: Path) -> Path:
    return tmp_path


def _binary(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(b"abc\x00\x01\x02def")
    return path


def _latin1(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait".encode("latin-1"))
    return path


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_missing, "no such file"),
        (_directory, "is a directory, not a text file"),
        (_binary, "looks like a binary file (it contains NUL bytes), not text"),
        (_latin1, "is not UTF-8 text (byte 0xe9 at offset 3)"),
        (_empty, "is empty"),
    ],
)
def test_load_text_refusals_are_one_line_data_errors(make: Callable[[Path], Path], reason: str,
                                                     tmp_path: Path) -> None:
    path = make(tmp_path)
    with pytest.raises(DataError) as info:
        load_text(path)
    assert info.type is DataError
    message = str(info.value)
    assert message == f"{path}: {reason}"
    assert len(message.splitlines()) == 1


def test_default_corpus_is_python_source() -> None:
    text, source = default_corpus(2000)
    assert len(text) >= 2000
    assert "standard-library files" in source
    assert "def " in text or "import " in text


# ---------------------------------------------------------------------------------------------------
# TextData
# ---------------------------------------------------------------------------------------------------


def test_text_data_splits_90_10() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    data = TextData.from_text(text, block_size=9)
    assert data.tokenizer == CharTokenizer.from_text(text)
    assert data.train.dtype == torch.long
    assert data.train.tolist() == data.tokenizer.encode(text[:90])
    assert data.val.tolist() == data.tokenizer.encode(text[90:])


def test_text_data_uses_a_given_tokenizer() -> None:
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz")
    data = TextData.from_text("ab" * 50, 4, tokenizer=tok)
    assert data.tokenizer is tok
    assert data.train[:4].tolist() == [0, 1, 0, 1]
    with pytest.raises(DataError, match="characters not in the vocabulary: 'A'"):
        TextData.from_text("AB" * 50, 4, tokenizer=tok)


def test_text_too_short_for_the_block_size() -> None:
    text = "x" * 100  # train 90, val 10: block_size 9 fits (10 tokens each), 10 does not
    TextData.from_text(text, 9)
    with pytest.raises(DataError) as info:
        TextData.from_text(text, 10, source="small.txt")
    assert info.type is DataError
    message = str(info.value)
    assert message.startswith("small.txt: 100 characters is too short for block_size=10")
    assert "train has 90, validation 10" in message
    assert len(message.splitlines()) == 1
    with pytest.raises(DataError, match="the text: is empty"):
        TextData.from_text("", 4)


# ---------------------------------------------------------------------------------------------------
# get_batch
# ---------------------------------------------------------------------------------------------------


def test_batches_are_windows_of_the_data_and_targets_are_shifted_by_one() -> None:
    data = torch.randint(50, (300,), generator=torch.Generator().manual_seed(0))
    x, y = get_batch(data, 16, 7, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (16, 7)
    assert x.dtype == y.dtype == data.dtype
    windows = data.unfold(0, 8, 1)  # every window of 8 consecutive tokens
    for row_x, row_y in zip(x, y, strict=True):
        matches = [w for w in windows if torch.equal(w[:7], row_x) and torch.equal(w[1:], row_y)]
        assert matches, "a batch row is not a window of the data with its successor tokens"


def test_every_start_position_is_reachable_and_none_beyond() -> None:
    n, block = 20, 4
    data = torch.arange(n)
    x, y = get_batch(data, 2000, block, torch.Generator().manual_seed(0))
    assert torch.equal(x, x[:, :1] + torch.arange(block))
    assert torch.equal(y, x + 1)
    starts = set(x[:, 0].tolist())
    assert starts == set(range(n - block))  # the last window's target is the final token


def test_batches_are_reproducible_with_a_seeded_generator() -> None:
    data = torch.randint(30, (500,), generator=torch.Generator().manual_seed(0))
    first = get_batch(data, 8, 5, torch.Generator().manual_seed(42))
    second = get_batch(data, 8, 5, torch.Generator().manual_seed(42))
    other = get_batch(data, 8, 5, torch.Generator().manual_seed(43))
    assert torch.equal(first[0], second[0])
    assert torch.equal(first[1], second[1])
    assert not torch.equal(first[0], other[0])
    generator = torch.Generator().manual_seed(42)
    get_batch(data, 8, 5, generator)
    assert not torch.equal(get_batch(data, 8, 5, generator)[0], first[0])  # the generator advances


def test_get_batch_checks_its_data() -> None:
    with pytest.raises(ShapeError) as info:
        get_batch(torch.zeros(3, 40, dtype=torch.long), 2, 4, torch.Generator())
    assert info.value.argument == "data"
    with pytest.raises(ShapeError) as info:
        get_batch(torch.zeros(40), 2, 4, torch.Generator())
    assert info.value.argument == "data"
