"""Checkpoint integrity (a sha256 over tensors and metadata, verified on load), validation of every field behind
it, the run directory's lock and temporary files, and file modes that follow the umask."""

import fcntl
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.support.cli import rewrite
from typed_transformer.checkpoint import (
    CHECKPOINT_NAME,
    LOCK_NAME,
    CheckpointError,
    RunDirectoryError,
    load_checkpoint,
    remove_temporaries,
    run_directory,
    save_checkpoint,
    temporary_path,
)
from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.training import TrainConfig, train

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 12


@pytest.fixture(scope="module")
def data() -> TextData:
    return TextData.from_text(TEXT, 8)


@pytest.fixture(scope="module")
def saved(data: TextData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint after 3 training steps: weights, AdamW state, RNG states, history."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))
    config = TrainConfig(max_iters=3, batch_size=2, eval_interval=2, eval_iters=1, sample_tokens=0, warmup_iters=1)
    out = tmp_path_factory.mktemp("saved")
    train(model, data, config, out, progress=False)
    return out / CHECKPOINT_NAME


def refused(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert info.type is CheckpointError
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def test_a_real_checkpoint_loads(saved: Path) -> None:
    checkpoint = load_checkpoint(saved)
    assert checkpoint.iteration == 3
    assert [h["iter"] for h in checkpoint.history] == [0, 2, 3]
    assert checkpoint.optimizer_state is not None
    assert set(checkpoint.rng) == {"batches", "torch"}


def test_a_flipped_tensor_byte_fails_the_integrity_check(saved: Path, tmp_path: Path) -> None:
    raw = bytearray(saved.read_bytes())
    raw[-100] ^= 0x01  # inside the last tensor's data: still a readable safetensors file
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(bytes(raw))
    assert refused(path) == ("corrupt checkpoint (integrity check failed: the tensors or metadata were modified or "
                             "damaged after it was written)")


def test_edited_metadata_fails_the_integrity_check(saved: Path, tmp_path: Path) -> None:
    path = rewrite(saved, tmp_path / "edited.safetensors", lambda t, m: m.update(iteration="2"), sign=False)
    assert "integrity check failed" in refused(path)
    path = rewrite(saved, tmp_path / "unsigned.safetensors", lambda t, m: m.pop("sha256"), sign=False)
    assert refused(path) == "corrupt checkpoint (no sha256 integrity field)"


def _set(key: str, value: Any) -> Callable[[dict[str, Tensor], dict[str, str]], object]:
    return lambda tensors, metadata: metadata.update({key: value if isinstance(value, str) else json.dumps(value)})


def _nan_weight(tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    tensors["model.ln_f.weight"] = tensors["model.ln_f.weight"].clone()
    tensors["model.ln_f.weight"][0] = float("nan")


def _drop(name: str) -> Callable[[dict[str, Tensor], dict[str, str]], object]:
    return lambda tensors, metadata: tensors.pop(name)


def _replace(name: str, value: Tensor) -> Callable[[dict[str, Tensor], dict[str, str]], object]:
    return lambda tensors, metadata: tensors.update({name: value})


def _retype(name: str, dtype: torch.dtype) -> Callable[[dict[str, Tensor], dict[str, str]], object]:
    return lambda tensors, metadata: tensors.update({name: tensors[name].to(dtype)})


def _group(key: str, value: Any) -> Callable[[dict[str, Tensor], dict[str, str]], object]:
    def change(tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        optimizer = json.loads(metadata["optimizer"])
        optimizer["param_groups"][0][key] = value
        metadata["optimizer"] = json.dumps(optimizer)

    return change


# Each corruption is re-signed (a valid hash), so only the field validation can catch it.
CORRUPTIONS: list[tuple[str, Callable[[dict[str, Tensor], dict[str, str]], object], str]] = [
    ("iteration -5", _set("iteration", "-5"), "iteration must be a non-negative integer, got '-5'"),
    ("iteration text", _set("iteration", "seven"), "iteration must be a non-negative integer, got 'seven'"),
    ("history not a list", _set("history", {"iter": 0}), "history must be a list, got dict"),
    ("history entry", _set("history", [[0, 1.0]]), "history entry [0, 1.0] is not a dict with 'iter'"),
    ("history value", _set("history", [{"iter": 0, "train": "low"}]), "'train' must be iter, train or val with"),
    ("history NaN", _set("history", [{"iter": 0, "train": float("nan")}]), "'train' must be iter, train or val"),
    ("history order", _set("history", [{"iter": 2}, {"iter": 1}]), "iterations must increase and not pass 3"),
    ("history future", _set("history", [{"iter": 9}]), "iterations must increase and not pass 3"),
    ("train_config key", _set("train_config", {"max_iters": 3, "speed": "fast"}),
     "train_config has unknown key 'speed'"),
    ("train_config type", _set("train_config", {"max_iters": "3"}), "max_iters must be a positive int, got '3'"),
    ("train_config lr", _set("train_config", {"learning_rate": float("inf")}), "learning_rate must be a finite"),
    ("train_config not a dict", _set("train_config", [1]), "train_config must be a dict, got list"),
    ("model_config bias", lambda t, m: m.update(model_config=json.dumps({**json.loads(m["model_config"]),
                                                                         "bias": "no"})),
     "GPTConfig: bias must be True or False, got 'no'"),
    ("model_config unknown", lambda t, m: m.update(model_config=json.dumps({**json.loads(m["model_config"]),
                                                                            "width": 3})),
     "GPTConfig: unknown fields ['width']"),
    ("tokenizer size", _set("tokenizer", {"chars": "abc"}), "the tokenizer has 3 characters, the model's vocab_size"),
    ("tokenizer repeated", _set("tokenizer", {"chars": "aa"}), "the vocabulary has repeated characters"),
    ("info", _set("info", [1, 2]), "info must be a dict"),
    ("unknown field", _set("notes", "hello"), "unknown metadata field 'notes'"),
    ("NaN weight", _nan_weight, "weight ln_f.weight holds NaN or infinity"),
    ("missing optimizer tensor", _drop("optim.0.exp_avg"), "optimizer state of parameter 0 lacks the tensor exp_avg"),
    ("optimizer tensor shape", _replace("optim.1.exp_avg_sq", torch.zeros(3)),
     "optimizer tensor 1.exp_avg_sq has shape (3,)"),
    ("optimizer NaN", _replace("optim.0.step", torch.tensor(float("nan"))), "optimizer tensor 0.step holds NaN"),
    ("optimizer stray", _replace("optim.99.exp_avg", torch.zeros(1)), "optimizer tensor optim.99.exp_avg belongs to"),
    ("optimizer groups", lambda t, m: m.update(optimizer=json.dumps({**json.loads(m["optimizer"]),
                                                                     "param_groups": []})),
     "optimizer param_groups do not list the model's"),
    ("RNG size", _replace("rng.batches", torch.zeros(7, dtype=torch.uint8)),
     "random-number state rng.batches is torch.uint8 (7,), expected uint8"),
    ("RNG dtype", lambda t, m: t.update({"rng.torch": t["rng.torch"].float()}),
     "random-number state rng.torch is torch.float32"),
    ("RNG name", _replace("rng.cuda", torch.zeros(7, dtype=torch.uint8)), "unknown random-number state rng.cuda"),
    ("stray tensor", _replace("extra.x", torch.zeros(1)), "unexpected tensor extra.x"),
    # dtypes: torch's load_state_dict would cast each of these silently
    ("int32 weight", _retype("model.ln_f.weight", torch.int32),
     "weight ln_f.weight is torch.int32, expected torch.float32 (the dtype of tok_emb.weight; a model holds one "
     "dtype)"),
    ("float64 weight", _retype("model.blocks.0.attn.in_proj.weight", torch.float64),
     "weight blocks.0.attn.in_proj.weight is torch.float64, expected torch.float32"),
    ("integer model", _retype("model.tok_emb.weight", torch.int64),
     "weight tok_emb.weight is torch.int64, expected a floating-point dtype (torch.float32, torch.float64, "),
    ("int64 step", _retype("optim.0.step", torch.int64),
     "optimizer tensor 0.step is torch.int64, expected torch.float32 or torch.float64 (AdamW's step count is a float "
     "tensor)"),
    ("int exp_avg", _retype("optim.2.exp_avg", torch.int32),
     "optimizer tensor 2.exp_avg is torch.int32, expected torch.float32 (the dtype of its parameter)"),
    ("half exp_avg_sq", _retype("optim.1.exp_avg_sq", torch.float16),
     "optimizer tensor 1.exp_avg_sq is torch.float16, expected torch.float32"),
    # AdamW's invariants
    ("negative exp_avg_sq", lambda t, m: t.update({"optim.1.exp_avg_sq": -t["optim.1.exp_avg_sq"] - 1.0}),
     "optimizer tensor 1.exp_avg_sq holds a negative value ("),
    ("step 0", _replace("optim.0.step", torch.tensor(0.0)),
     "optimizer tensor 0.step is 0, expected a whole number >= 1 (the number of steps taken)"),
    ("step 2.5", _replace("optim.0.step", torch.tensor(2.5)), "optimizer tensor 0.step is 2.5, expected a whole"),
    ("unknown state tensor", _replace("optim.0.momentum_buffer", torch.zeros(1)),
     "optimizer tensor 0.momentum_buffer is not part of AdamW's state"),
    ("state field", lambda t, m: m.update(optimizer=json.dumps({**json.loads(m["optimizer"]),
                                                               "state": {"0": {"lr_scale": 2}}})),
     "optimizer state of parameter 0 has the unknown field 'lr_scale'"),
    ("negative lr", _group("lr", -1.0), "optimizer param_groups: Invalid learning rate: -1.0"),
    ("beta 1.5", _group("betas", [1.5, 0.99]), "optimizer param_groups: Invalid beta parameter at index 0: 1.5"),
    ("eps", _group("eps", -1e-8), "optimizer param_groups: Invalid epsilon value: -1e-08"),
]


@pytest.mark.parametrize(("name", "change", "words"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_every_field_is_validated_behind_the_hash(name: str, change: Any, words: str, saved: Path,
                                                  tmp_path: Path) -> None:
    message = refused(rewrite(saved, tmp_path / "bad.safetensors", change))
    assert message.startswith("corrupt checkpoint (")
    assert words in message


def test_a_weight_of_the_wrong_shape(saved: Path, tmp_path: Path) -> None:
    path = rewrite(saved, tmp_path / "bad.safetensors", _replace("model.ln_f.weight", torch.ones(3)))
    assert refused(path).startswith("weights do not fit the model (Error(s) in loading state_dict for GPT: "
                                    "size mismatch for ln_f.weight")


def test_checkpoint_bytes_bounds_the_real_file_within_64_kib(saved: Path, data: TextData, tmp_path: Path) -> None:
    from typed_transformer.checkpoint import checkpoint_bytes

    checkpoint = load_checkpoint(saved)
    size = saved.stat().st_size
    estimate = checkpoint_bytes(checkpoint.model, evaluations=len(checkpoint.history))
    assert size <= estimate <= size + 2**16
    torch.manual_seed(0)  # a larger model, many evaluations, no optimizer state
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=32, n_layer=3, n_head=4, n_embd=64))
    history = [{"iter": i, "train": 1.0 + 1 / (i + 3), "val": 2.0 + 1 / (i + 7)} for i in range(400)]
    path = save_checkpoint(tmp_path, model, data.tokenizer, iteration=400, history=history)
    estimate = checkpoint_bytes(model, evaluations=400, optimizer=False)
    assert path.stat().st_size <= estimate <= path.stat().st_size + 2**16


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_model_saved_in_another_floating_dtype_loads_in_it_bit_for_bit(dtype: torch.dtype, data: TextData,
                                                                         tmp_path: Path) -> None:
    """Never a silent cast: a model saved in float64 (or bfloat16) comes back in float64, every bit as saved
    (it came back in float32 before)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8)).to(dtype)
    loaded = load_checkpoint(save_checkpoint(tmp_path, model, data.tokenizer)).model
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert loaded.lm_head.weight is loaded.tok_emb.weight  # still tied


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_checkpoint_file_follows_the_umask(umask: int, mode: int, data: TextData, tmp_path: Path) -> None:
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=4))
    old = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path, model, data.tokenizer)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode


def test_temporary_names_are_unique_and_cleaned(tmp_path: Path) -> None:
    final = tmp_path / CHECKPOINT_NAME
    names = {temporary_path(final) for _ in range(50)}
    assert len(names) == 50
    assert all(re.fullmatch(rf"\.checkpoint\.safetensors\.tmp-{os.getpid()}-[0-9a-f]{{8}}\.safetensors", p.name)
               for p in names)
    stale = [*sorted(names)[:3], tmp_path / ".checkpoint.safetensors.abc123.tmp", tmp_path / ".loss.png.tmp.png",
             temporary_path(tmp_path / "loss.png"), tmp_path / ".tmpDSoRlw"]  # the last: safetensors' own
    keep = [final, tmp_path / "loss.png", tmp_path / "notes.tmp", tmp_path / LOCK_NAME]
    for path in (*stale, *keep):
        path.write_bytes(b"x")
    assert sorted(remove_temporaries(tmp_path)) == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(keep)


def test_run_directory_locks_cleans_and_is_reentrant(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    stale = temporary_path(out / CHECKPOINT_NAME)
    stale.write_bytes(b"partial")
    with run_directory(out):
        assert not stale.exists()
        assert (out / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with run_directory(out):  # the command line holds it around train(), which takes it again
            pass
        other = os.open(out / LOCK_NAME, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # still held after the nested block ended
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert not (out / LOCK_NAME).exists()  # removed when the run ended
    held = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)  # now another process (here: another open file) holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirectoryError, match=re.escape(f"{out}: another run is using this directory (pid ")), \
                run_directory(out):
            pass
    finally:
        os.close(held)
    with run_directory(out):  # released: usable again
        pass


def test_train_refuses_an_existing_checkpoint_without_resume_or_overwrite(saved: Path, data: TextData,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / CHECKPOINT_NAME).write_bytes(saved.read_bytes())
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))
    config = TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, sample_tokens=0)
    with pytest.raises(RunDirectoryError, match=re.escape(f"{out / CHECKPOINT_NAME} exists: continue that run")):
        train(model, data, config, out, progress=False)
    assert (out / CHECKPOINT_NAME).read_bytes() == saved.read_bytes()
    assert train(model, data, config, out, progress=False, overwrite=True).iteration == 2
    assert load_checkpoint(out).iteration == 2


def test_a_checkpoint_from_before_the_hash_still_loads_with_its_fields_validated(saved: Path, tmp_path: Path) -> None:
    def legacy(tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        metadata.update(format="typed-transformer-gpt/1")
        del metadata["sha256"]

    old = rewrite(saved, tmp_path / "old.safetensors", legacy, sign=False)
    assert load_checkpoint(old).iteration == 3
    assert load_checkpoint(saved).model.config == load_checkpoint(old).model.config

    def legacy_damaged(tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        legacy(tensors, metadata)
        metadata.update(iteration="-5")

    damaged = rewrite(saved, tmp_path / "damaged.safetensors", legacy_damaged, sign=False)
    assert refused(damaged) == "corrupt checkpoint (iteration must be a non-negative integer, got '-5')"
