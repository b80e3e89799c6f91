"""Every loader of the project against the same hostile files: a pickle that runs code, a stride-0 view that claims
10^8 rows, a huge declared shape, NaN weights, integer weights, an empty file and random bytes. Each is refused in
one line of the loader's documented error type, before anything large is materialised, and no code in a file runs.

The loaders: the GPT checkpoint (``load_checkpoint``, safetensors), the encoder-decoder checkpoint
(``load_seq2seq``, safetensors) and the tutorial's weights (``load_tutorial_weights``, ``torch.save`` files).
"""

import io
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from tests.support.tutorial_gpt import BigramLanguageModel
from typed_transformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.run_files import content_digest
from typed_transformer.seq2seq_training import Seq2SeqConfig, load_seq2seq, train_seq2seq
from typed_transformer.tutorial import load_tutorial_weights

MARKER = "code_ran"


class _RunsCode:
    """Unpickling this opens (creates) a marker file: the proof that a loader ran code from a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def gpt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = TextData.from_text("the quick brown fox jumps over the lazy dog.\n" * 12, 8)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16))
    return save_checkpoint(tmp_path_factory.mktemp("gpt"), model, data.tokenizer, iteration=3)


@pytest.fixture(scope="module")
def seq2seq_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = Seq2SeqConfig(max_len=4, d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_iters=2,
                           eval_interval=2, eval_pairs=4)
    out = tmp_path_factory.mktemp("seq2seq") / "run"
    train_seq2seq(config, out, log=io.StringIO())
    return out / "checkpoint.safetensors"


@pytest.fixture(scope="module")
def tutorial_state() -> dict[str, Tensor]:
    torch.manual_seed(0)
    return BigramLanguageModel(vocab_size=10, n_embd=32, n_head=2, n_layer=1, block_size=8).state_dict()


# -- the hostile files, each written where the loader will look -------------------------------------------------


def _resigned(source: Path, target: Path, change: Callable[[dict[str, Tensor]], None]) -> None:
    """A safetensors checkpoint with its tensors changed and its integrity hash recomputed: only the loader's own
    checks of the values stand between the file and the model."""
    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(source))
    change(tensors)
    save_file(tensors, str(target), metadata={**metadata, "sha256": content_digest(tensors, metadata)})


def _first_weight(tensors: dict[str, Tensor]) -> str:
    return next(name for name in sorted(tensors) if name.startswith("model.") and tensors[name].ndim == 2)


def _nan(tensors: dict[str, Tensor]) -> None:
    tensors[_first_weight(tensors)][0, 0] = float("nan")


def _integers(tensors: dict[str, Tensor]) -> None:
    name = _first_weight(tensors)
    tensors[name] = tensors[name].round().to(torch.int64)


def _claims(source: Path, target: Path, shape: list[int]) -> None:
    """The first weight's header entry claims ``shape`` while its bytes stay as they were (safetensors has no views:
    this is its stride-0 expand and its huge declared shape)."""
    raw = source.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    name = next(k for k in sorted(header) if k.startswith("model.") and len(header[k]["shape"]) == 2)
    header[name]["shape"] = shape
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    target.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])


def _pickle_that_runs_code(target: Path) -> None:
    torch.save({"token_embedding_table.weight": _RunsCode(target.parent / MARKER)}, target)


SAFETENSORS_KINDS: dict[str, Callable[[Path, Path], object]] = {
    "a pickle that runs code": lambda source, target: _pickle_that_runs_code(target),
    "a stride-0 view claiming 10^8 rows": lambda source, target: _claims(source, target, [10**8, 16]),
    "a huge declared shape": lambda source, target: _claims(source, target, [2**40, 2**20]),
    "NaN weights": lambda source, target: _resigned(source, target, _nan),
    "integer weights": lambda source, target: _resigned(source, target, _integers),
    "an empty file": lambda source, target: target.write_bytes(b""),
    "random bytes": lambda source, target: target.write_bytes(bytes(range(256)) * 64),
}

TUTORIAL_KINDS: dict[str, Callable[[dict[str, Tensor], Path], object]] = {
    "a pickle that runs code": lambda state, target: _pickle_that_runs_code(target),
    "a stride-0 view claiming 10^8 rows": lambda state, target: torch.save(
        {**state, "token_embedding_table.weight": torch.zeros(1, 32).expand(10**8, 32)}, target),
    "a huge declared shape": lambda state, target: torch.save(
        {**state, "token_embedding_table.weight": torch.zeros(1).as_strided((2**40, 2**20), (0, 0))}, target),
    "NaN weights": lambda state, target: torch.save(
        {**state, "lm_head.bias": torch.full((10,), float("nan"))}, target),
    "integer weights": lambda state, target: torch.save(
        {**state, "lm_head.weight": torch.zeros(10, 32, dtype=torch.int64)}, target),
    "an empty file": lambda state, target: target.write_bytes(b""),
    "random bytes": lambda state, target: target.write_bytes(bytes(range(256)) * 64),
}


def _refused(load: Callable[[Path], Any], path: Path, error: type[Exception]) -> str:
    start = time.perf_counter()
    with pytest.raises(error) as info:
        load(path)
    assert info.type is error  # the documented type itself, not a subclass or a stray RuntimeError
    assert time.perf_counter() - start < 10  # refused before anything large is materialised
    assert not (path.parent / MARKER).exists()  # no code in the file ran
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{path}: "), message
    return message


@pytest.mark.parametrize("kind", SAFETENSORS_KINDS)
@pytest.mark.parametrize("loader", ["gpt", "seq2seq"])
def test_each_checkpoint_loader_refuses_each_hostile_file_in_one_line(loader: str, kind: str, gpt_file: Path,
                                                                      seq2seq_file: Path, tmp_path: Path) -> None:
    source, load = (gpt_file, load_checkpoint) if loader == "gpt" else (seq2seq_file, load_seq2seq)
    target = tmp_path / "hostile.safetensors"
    SAFETENSORS_KINDS[kind](source, target)
    message = _refused(load, target, CheckpointError)
    if kind == "NaN weights":
        assert "non-finite" in message or "NaN" in message, message
    if kind == "integer weights":
        assert "int64" in message, message


@pytest.mark.parametrize("kind", TUTORIAL_KINDS)
def test_the_tutorial_loader_refuses_each_hostile_file_in_one_line(kind: str, tutorial_state: dict[str, Tensor],
                                                                   tmp_path: Path) -> None:
    target = tmp_path / "hostile.pt"
    TUTORIAL_KINDS[kind](tutorial_state, target)
    message = _refused(load_tutorial_weights, target, ValueError)
    if kind == "NaN weights":
        assert "non-finite" in message, message
    if kind == "integer weights":
        assert "int64" in message, message


def test_the_sources_load(gpt_file: Path, seq2seq_file: Path, tutorial_state: dict[str, Tensor],
                          tmp_path: Path) -> None:
    """The hostile files are edits of files that load: each refusal is the edit's."""
    assert load_checkpoint(gpt_file).iteration == 3
    assert load_seq2seq(seq2seq_file).iteration >= 1
    torch.save(tutorial_state, tmp_path / "tutorial.pt")
    assert isinstance(load_tutorial_weights(tmp_path / "tutorial.pt"), GPT)
