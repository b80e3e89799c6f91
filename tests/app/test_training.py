"""Checkpoints (round trip, atomic writes, refusals, no pickle) and training (schedule, AdamW groups, a
tiny run, Ctrl-C, and resumption that reproduces the uninterrupted run exactly)."""

import io
import itertools
import json
import math
import os
import signal
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import Tensor

from typed_transformer.checkpoint import CHECKPOINT_NAME, CheckpointError, load_checkpoint, save_checkpoint
from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.run_files import content_digest
from typed_transformer.training import TrainConfig, TrainResult, gpt_learning_rate, train

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 12


def tiny_config(vocab_size: int, **overrides: Any) -> GPTConfig:
    fields: dict[str, Any] = {"vocab_size": vocab_size, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16}
    return GPTConfig(**{**fields, **overrides})


def tiny_train(**overrides: Any) -> TrainConfig:
    fields: dict[str, Any] = {"max_iters": 12, "batch_size": 4, "eval_interval": 4, "eval_iters": 2,
                              "checkpoint_interval": 100, "warmup_iters": 2, "sample_tokens": 0,
                              "learning_rate": 3e-3, "min_lr": 3e-4}
    return TrainConfig(**{**fields, **overrides})


def tiny_model(data: TextData, seed: int = 0, **overrides: Any) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(data.tokenizer.vocab_size, **overrides))


def assert_same_weights(a: GPT, b: GPT, atol: float = 0.0) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        if not torch.allclose(sa[name], sb[name], rtol=0.0, atol=atol):
            difference = (sa[name] - sb[name]).abs().max().item()
            raise AssertionError(f"{name}: largest difference {difference:.3g} > {atol}")


@pytest.fixture(scope="module")
def data() -> TextData:
    return TextData.from_text(TEXT, 8)


# ---------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Path, data: TextData) -> None:
    model = tiny_model(data, positional="rope", n_kv_heads=1, bias=True)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param))
    history = [{"iter": 0.0, "train": 3.5, "val": 3.25}, {"iter": 4.0, "train": 2.0, "val": 2.125}]
    path = save_checkpoint(tmp_path, model, data.tokenizer, iteration=7, train_config={"max_iters": 12},
                           history=history, info={"source": "x.txt"},
                           rng={"batches": torch.Generator().manual_seed(3).get_state()})
    assert path == tmp_path / CHECKPOINT_NAME
    loaded = load_checkpoint(path)
    assert loaded.model.config == model.config
    assert_same_weights(loaded.model, model)
    assert loaded.model.lm_head.weight is loaded.model.tok_emb.weight  # still tied
    assert loaded.tokenizer == data.tokenizer
    assert loaded.tokenizer.chars == data.tokenizer.chars
    assert (loaded.iteration, loaded.train_config, loaded.history, loaded.info) == (
        7, {"max_iters": 12}, history, {"source": "x.txt"})
    assert loaded.optimizer_state is None
    assert torch.equal(loaded.rng["batches"], torch.Generator().manual_seed(3).get_state())
    idx = torch.randint(data.tokenizer.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    model.eval()
    torch.testing.assert_close(loaded.model.eval()(idx)[0], model(idx)[0], rtol=0.0, atol=0.0)
    assert load_checkpoint(tmp_path).iteration == 7  # the directory works too


def test_untied_model_round_trip(tmp_path: Path, data: TextData) -> None:
    model = tiny_model(data, tie_weights=False)
    with torch.no_grad():
        model.lm_head.weight.normal_()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "run" / "c.safetensors", model, data.tokenizer))
    assert loaded.model.lm_head.weight is not loaded.model.tok_emb.weight
    assert_same_weights(loaded.model, model)


def test_optimizer_state_round_trip(tmp_path: Path, data: TextData) -> None:
    model = tiny_model(data)
    optimizer = torch.optim.AdamW(model.parameter_groups(0.1), lr=1e-3)
    x, y = data.train[:8][None], data.train[1:9][None]
    for _ in range(2):
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward has no annotations
        optimizer.step()
    loaded = load_checkpoint(save_checkpoint(tmp_path, model, data.tokenizer, optimizer=optimizer))
    assert loaded.optimizer_state is not None
    restored = torch.optim.AdamW(loaded.model.parameter_groups(0.1), lr=1e-3)
    restored.load_state_dict(loaded.optimizer_state)
    original, again = optimizer.state_dict(), restored.state_dict()
    for group in (*original["param_groups"], *again["param_groups"]):
        group["betas"] = tuple(group["betas"])  # JSON gives a list back; AdamW takes either
    assert original["param_groups"] == again["param_groups"]
    assert original["state"].keys() == again["state"].keys()
    for index, values in original["state"].items():
        for key, value in values.items():
            torch.testing.assert_close(again["state"][index][key], value, rtol=0.0, atol=0.0)


def test_checkpoint_is_a_plain_safetensors_file(tmp_path: Path, data: TextData) -> None:
    model = tiny_model(data)
    path = save_checkpoint(tmp_path, model, data.tokenizer, iteration=3)
    raw = path.read_bytes()
    (header_length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_length])  # JSON header, then raw tensor bytes: no pickle
    assert header["__metadata__"]["format"] == "typed-transformer-gpt/2"
    assert json.loads(header["__metadata__"]["tokenizer"]) == {"chars": data.tokenizer.chars}
    with safe_open(str(path), framework="pt") as handle:
        keys = set(handle.keys())
        assert handle.metadata()["iteration"] == "3"
        torch.testing.assert_close(handle.get_tensor("model.tok_emb.weight"), model.tok_emb.weight.detach(),
                                   rtol=0.0, atol=0.0)
    expected = {f"model.{name}" for name in model.state_dict() if name != "lm_head.weight"}
    assert keys == expected


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(
    tmp_path: Path, data: TextData, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tiny_model(data, seed=1)
    path = save_checkpoint(tmp_path, first, data.tokenizer, iteration=1)
    before = path.read_bytes()
    written: list[str] = []

    def failing_save_file(tensors: dict[str, Tensor], filename: str, metadata: dict[str, str] | None = None) -> None:
        with open(filename, "wb") as stream:
            stream.write(b"\x00\x01partial")  # half a file, then the disk fills up
        written.append(filename)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", failing_save_file)
    with pytest.raises(OSError, match="No space left on device"):
        save_checkpoint(tmp_path, tiny_model(data, seed=2), data.tokenizer, iteration=2)
    assert len(written) == 1
    assert Path(written[0]).parent == tmp_path
    assert not Path(written[0]).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    assert path.read_bytes() == before
    loaded = load_checkpoint(path)
    assert loaded.iteration == 1
    assert_same_weights(loaded.model, first)


def test_an_interrupt_during_save_also_cleans_up(tmp_path: Path, data: TextData,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint(tmp_path, tiny_model(data), data.tokenizer, iteration=1)

    def interrupted(tensors: dict[str, Tensor], filename: str, metadata: dict[str, str] | None = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, tiny_model(data), data.tokenizer, iteration=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    assert load_checkpoint(path).iteration == 1


def _valid_bytes(tmp_path: Path, data: TextData) -> bytes:
    return save_checkpoint(tmp_path / "valid", tiny_model(data), data.tokenizer, iteration=5).read_bytes()


def _rewrite_metadata(raw: bytes, **changes: str) -> bytes:
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header["__metadata__"].update(changes)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :]


@pytest.mark.parametrize(
    ("corrupt", "words"),
    [
        (lambda raw: raw[: len(raw) // 2], "not a readable checkpoint"),
        (lambda raw: raw[:-1], "not a readable checkpoint"),
        (lambda raw: raw[:5], "not a readable checkpoint"),
        (lambda raw: b"", "not a readable checkpoint"),
        (lambda raw: b"just some text, certainly not a checkpoint\n" * 4, "not a readable checkpoint"),
        (lambda raw: raw[:8] + b"#" + raw[9:], "not a readable checkpoint"),
        (lambda raw: _rewrite_metadata(raw, format="something-else/2"), "not a typed-transformer GPT checkpoint"),
        (lambda raw: _rewrite_metadata(raw, model_config="{not json"), "corrupt checkpoint"),
        (lambda raw: _rewrite_metadata(raw, model_config=json.dumps({"vocab_size": 3})), "corrupt checkpoint"),
        (lambda raw: _rewrite_metadata(raw, iteration="seven"), "corrupt checkpoint"),
        (lambda raw: _rewrite_metadata(raw, tokenizer="{}"), "corrupt checkpoint"),
    ],
)
def test_corrupt_checkpoints_raise_checkpoint_error(corrupt: Any, words: str, tmp_path: Path, data: TextData) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(corrupt(_valid_bytes(tmp_path, data)))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert info.type is CheckpointError
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert words in message
    assert len(message.splitlines()) == 1


def test_a_checkpoint_missing_a_weight(tmp_path: Path, data: TextData) -> None:
    from safetensors.torch import load_file, save_file

    path = save_checkpoint(tmp_path, tiny_model(data), data.tokenizer)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    del tensors["model.blocks.1.mlp.linear1.weight"]
    save_file(tensors, str(path), metadata={**metadata, "sha256": content_digest(tensors, metadata)})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: weights do not fit the model (missing ['blocks.1.mlp.linear1.weight']")


def test_a_safetensors_file_that_is_not_ours(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"weight": torch.zeros(3)}, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="not a typed-transformer GPT checkpoint \\(format 'pt'\\)"):
        load_checkpoint(path)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "nothing.safetensors")
    assert str(info.value) == f"{tmp_path / 'nothing.safetensors'}: no such checkpoint"
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path)  # a directory without a checkpoint


# ---------------------------------------------------------------------------------------------------
# Learning rate and optimizer groups
# ---------------------------------------------------------------------------------------------------


def test_learning_rate_schedule() -> None:
    config = TrainConfig(max_iters=110, warmup_iters=10, learning_rate=1e-3, min_lr=1e-4)
    assert gpt_learning_rate(config, 0) == pytest.approx(1e-3 / 11)
    assert gpt_learning_rate(config, 4) == pytest.approx(1e-3 * 5 / 11)
    assert gpt_learning_rate(config, 9) == pytest.approx(1e-3 * 10 / 11)
    assert gpt_learning_rate(config, 10) == pytest.approx(1e-3)
    assert gpt_learning_rate(config, 60) == pytest.approx((1e-3 + 1e-4) / 2)  # cosine midpoint
    quarter = 1e-4 + (1e-3 - 1e-4) * (1 + math.cos(math.pi / 4)) / 2
    assert gpt_learning_rate(config, 35) == pytest.approx(quarter)
    assert gpt_learning_rate(config, 110) == pytest.approx(1e-4)
    assert gpt_learning_rate(config, 111) == 1e-4
    assert gpt_learning_rate(config, 10_000) == 1e-4
    after_warmup = [gpt_learning_rate(config, it) for it in range(10, 120)]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))
    during_warmup = [gpt_learning_rate(config, it) for it in range(11)]
    assert all(a < b for a, b in itertools.pairwise(during_warmup))


def _nanogpt_rate(peak: float, low: float, warmup: int, decay: int, it: int) -> float:
    """nanoGPT's ``get_lr``, written out here: warmup ``peak (it + 1) / (warmup + 1)``, cosine to ``low`` at
    ``decay``, ``low`` after."""
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it > decay:
        return low
    return low + (peak - low) * (1 + math.cos(math.pi * (it - warmup) / (decay - warmup))) / 2


#: gpt_learning_rate's values of TrainConfig(max_iters=100, warmup_iters=10, learning_rate=1e-3, min_lr=1e-4,
#: lr_decay_iters=80), to the bit: warm-up, the first step after it, the middle, the end of the decay, past it.
GPT_RATES = {0: 9.090909090909092e-05, 5: 0.0005454545454545455, 9: 0.0009090909090909091, 10: 0.001,
             45: 0.00055, 80: 0.0001, 81: 0.0001, 99: 0.0001}


def test_the_gpt_schedule_is_nanogpts_formula_at_each_phase() -> None:
    config = TrainConfig(max_iters=100, warmup_iters=10, learning_rate=1e-3, min_lr=1e-4, lr_decay_iters=80)
    for it, pinned in GPT_RATES.items():
        assert gpt_learning_rate(config, it) == pinned, it
        assert math.isclose(gpt_learning_rate(config, it), _nanogpt_rate(1e-3, 1e-4, 10, 80, it), rel_tol=1e-12), it
    assert gpt_learning_rate(config, 9) < 1e-3  # warm-up ends below the peak: (it + 1) / (warmup + 1)
    plain = TrainConfig(max_iters=100, warmup_iters=10, learning_rate=1e-3, min_lr=1e-4)  # decays over max_iters
    for it in (0, 9, 10, 55, 100, 101, 500):
        assert math.isclose(gpt_learning_rate(plain, it), _nanogpt_rate(1e-3, 1e-4, 10, 100, it), rel_tol=1e-12), it


def test_the_old_name_of_the_gpt_schedule_warns_and_gives_the_same_function() -> None:
    import typed_transformer.training as training

    with pytest.warns(DeprecationWarning, match="typed_transformer.training.gpt_learning_rate"):
        old = training.learning_rate
    assert old is gpt_learning_rate


def test_learning_rate_with_an_explicit_decay_length() -> None:
    config = TrainConfig(max_iters=100, warmup_iters=0, learning_rate=2e-3, min_lr=0.0, lr_decay_iters=40)
    assert gpt_learning_rate(config, 0) == pytest.approx(2e-3)
    assert gpt_learning_rate(config, 20) == pytest.approx(1e-3)
    assert gpt_learning_rate(config, 41) == 0.0
    assert gpt_learning_rate(config, 99) == 0.0


@pytest.mark.parametrize(
    "overrides",
    [{"max_iters": 0}, {"batch_size": -1}, {"eval_iters": 0}, {"eval_interval": 0}, {"checkpoint_interval": 0},
     {"learning_rate": 0.0}, {"min_lr": 2e-3}, {"min_lr": -1e-4}, {"warmup_iters": -1}, {"grad_clip": -1.0},
     {"weight_decay": -0.1}, {"sample_tokens": -1}, {"max_iters": True}],
)
def test_train_config_validation(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"must be|need 0 <= min_lr") as info:
        TrainConfig(**overrides)
    assert info.type is ValueError


def test_adamw_groups_decay_matrices_only_and_count_the_tied_weight_once(data: TextData) -> None:
    model = tiny_model(data, bias=True)
    decay_group, no_decay_group = model.parameter_groups(0.25)
    assert (decay_group["weight_decay"], no_decay_group["weight_decay"]) == (0.25, 0.0)
    by_id = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)
             if name != "lm_head.weight"}
    all_named = dict(model.named_parameters(remove_duplicate=False))
    assert all_named["lm_head.weight"] is all_named["tok_emb.weight"]
    decay = [by_id[id(p)] for p in decay_group["params"]]
    no_decay = [by_id[id(p)] for p in no_decay_group["params"]]
    assert len(decay) == len(set(decay))
    assert len(no_decay) == len(set(no_decay))
    assert decay.count("tok_emb.weight") == 1
    expected_decay = {name for name, p in all_named.items() if p.dim() >= 2 and name != "lm_head.weight"}
    expected_no_decay = {name for name, p in all_named.items() if p.dim() < 2}
    assert set(decay) == expected_decay
    assert set(no_decay) == expected_no_decay
    assert {"blocks.0.attn.in_proj.weight", "pos.weight", "tok_emb.weight"} <= expected_decay
    assert {"blocks.0.attn.in_proj.bias", "ln_f.weight", "blocks.1.ln_2.bias"} <= expected_no_decay
    total = sum(p.numel() for g in (decay_group, no_decay_group) for p in g["params"])
    assert total == model.num_parameters(non_embedding=False)


# ---------------------------------------------------------------------------------------------------
# Training runs
# ---------------------------------------------------------------------------------------------------


def test_a_tiny_run_learns_a_repetitive_text(tmp_path: Path) -> None:
    text = "abcdefgh" * 40
    data = TextData.from_text(text, 8)
    config = tiny_train(max_iters=40, eval_interval=20, learning_rate=1e-2, min_lr=1e-3, sample_tokens=16)
    result = train(tiny_model(data), data, config, tmp_path, progress=False)
    assert not result.interrupted
    assert result.iteration == 40
    assert [h["iter"] for h in result.history] == [0, 20, 40]
    first, last = result.history[0], result.history[-1]
    assert first["train"] == pytest.approx(math.log(8), abs=0.2)  # uniform guess over 8 characters
    assert last["train"] < 0.5 * first["train"]
    assert last["val"] < 0.5 * first["val"]
    assert result.checkpoint == tmp_path / CHECKPOINT_NAME
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = load_checkpoint(result.checkpoint)
    assert saved.iteration == 40
    assert saved.history == result.history
    assert_same_weights(saved.model, result.model)
    assert len(result.sample) == 16
    assert set(result.sample) <= set("abcdefgh")


def _interrupt_at(step: int) -> Any:
    def on_step(iteration: int) -> None:
        if iteration == step:
            os.kill(os.getpid(), signal.SIGINT)

    return on_step


def test_ctrl_c_stops_between_steps_and_saves(tmp_path: Path, data: TextData) -> None:
    handler_before = signal.getsignal(signal.SIGINT)
    steps: list[int] = []

    def on_step(iteration: int) -> None:
        steps.append(iteration)
        if iteration == 5:
            os.kill(os.getpid(), signal.SIGINT)

    result = train(tiny_model(data), data, tiny_train(sample_tokens=10), tmp_path, progress=False, on_step=on_step)
    assert result.interrupted
    assert result.iteration == 5
    assert steps == [1, 2, 3, 4, 5]
    assert result.sample == ""
    assert signal.getsignal(signal.SIGINT) is handler_before
    saved = load_checkpoint(tmp_path)
    assert saved.iteration == 5
    assert_same_weights(saved.model, result.model)
    assert [h["iter"] for h in saved.history] == [0, 4]


def _run(data: TextData, out: Path, config: TrainConfig, resume_from: Path | None = None,
         on_step: Any = None) -> TrainResult:
    if resume_from is None:
        return train(tiny_model(data, dropout=0.1), data, config, out, progress=False, on_step=on_step)
    checkpoint = load_checkpoint(resume_from)
    return train(checkpoint.model, data, config, out, resume=checkpoint, progress=False, on_step=on_step)


@pytest.fixture(scope="module")
def uninterrupted(data: TextData, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    # Dropout on, so that resuming must restore the global RNG as well as the batch generator.
    return _run(data, tmp_path_factory.mktemp("full"), tiny_train(lr_decay_iters=12))


@pytest.mark.parametrize("stop", [1, 4, 5, 11])
def test_resuming_after_ctrl_c_reproduces_the_uninterrupted_run(stop: int, tmp_path: Path, data: TextData,
                                                                  uninterrupted: TrainResult) -> None:
    config = tiny_train(lr_decay_iters=12)
    first = _run(data, tmp_path / "a", config, on_step=_interrupt_at(stop))
    assert first.interrupted
    assert first.iteration == stop
    resumed = _run(data, tmp_path / "b", config, resume_from=tmp_path / "a")
    assert not resumed.interrupted
    assert resumed.iteration == 12
    assert resumed.history == uninterrupted.history
    assert_same_weights(resumed.model, uninterrupted.model, atol=1e-6)
    assert_same_weights(load_checkpoint(tmp_path / "b").model, uninterrupted.model, atol=1e-6)


def test_resuming_after_a_shorter_run_reproduces_the_uninterrupted_run(tmp_path: Path, data: TextData,
                                                                        uninterrupted: TrainResult) -> None:
    # Stop at max_iters=8 (a multiple of eval_interval, so the final evaluation is also a scheduled one),
    # then continue to 12 with the same schedule (lr_decay_iters fixed, so max_iters does not change it).
    short = _run(data, tmp_path / "a", tiny_train(max_iters=8, lr_decay_iters=12))
    assert short.iteration == 8
    assert not short.interrupted
    resumed = _run(data, tmp_path / "a", tiny_train(lr_decay_iters=12), resume_from=tmp_path / "a")
    assert resumed.iteration == 12
    assert resumed.history == uninterrupted.history
    assert_same_weights(resumed.model, uninterrupted.model, atol=1e-6)


def test_periodic_checkpoints_are_written(tmp_path: Path, data: TextData) -> None:
    seen: list[int] = []

    def on_step(iteration: int) -> None:
        if iteration in (4, 5):
            seen.append(load_checkpoint(tmp_path).iteration if (tmp_path / CHECKPOINT_NAME).exists() else -1)

    train(tiny_model(data), data, tiny_train(max_iters=6, checkpoint_interval=4), tmp_path, progress=False,
          on_step=on_step)
    # Checked in on_step before the save of that step: nothing at step 4 yet, the step-4 checkpoint at 5.
    assert seen == [-1, 4]
    assert load_checkpoint(tmp_path).iteration == 6


def test_presets_bring_their_own_training_settings() -> None:
    assert TrainConfig.for_preset("baby") == TrainConfig(learning_rate=3e-3, min_lr=3e-4, optimizer="muon",
                                                         max_iters=1200, lr_decay_iters=800, warmup_iters=30,
                                                         eval_interval=100)
    # the decay goes with the length: two thirds of an overridden max_iters, unless given itself
    assert TrainConfig.for_preset("baby", max_iters=600).lr_decay_iters == 400
    assert TrainConfig.for_preset("baby", max_iters=5).lr_decay_iters == 3
    assert TrainConfig.for_preset("baby", max_iters=600, lr_decay_iters=500).lr_decay_iters == 500
    # the warm-up too (issue 43: --max-iters 20 scaled the decay to 13 and kept 30 warm-up iterations)
    short = TrainConfig.for_preset("baby", max_iters=20)
    assert (short.warmup_iters, short.lr_decay_iters) == (1, 13)
    assert TrainConfig.for_preset("baby", max_iters=600).warmup_iters == 15
    assert TrainConfig.for_preset("baby", max_iters=600, warmup_iters=40).warmup_iters == 40
    assert TrainConfig.for_preset("baby", optimizer="adamw", max_iters=100).warmup_iters == 5
    # the other optimizer: AdamW's own settings for the preset (nanoGPT's length), a flag still winning
    assert TrainConfig.for_preset("baby", optimizer="adamw") == TrainConfig(learning_rate=3e-3, min_lr=3e-4)
    assert TrainConfig.for_preset("baby", optimizer="adamw", max_iters=5).max_iters == 5
    assert TrainConfig.for_preset("seed") == TrainConfig()
    assert TrainConfig.for_preset("baby", optimizer="adamw", learning_rate=1e-2) == TrainConfig(learning_rate=1e-2,
                                                                                                  min_lr=1e-3)
    assert TrainConfig.for_preset("baby", max_iters=5).learning_rate == 3e-3
    # the same rule when a resumed run overrides its checkpoint's settings
    assert TrainConfig.overridden({"max_iters": 7, "learning_rate": 3e-3, "min_lr": 3e-4}, learning_rate=2e-3) == \
        TrainConfig(max_iters=7, learning_rate=2e-3, min_lr=2e-4)
    with pytest.raises(ValueError, match=r"^unknown preset 'huge'; choose one of baby, seed$"):
        TrainConfig.for_preset("huge")


def test_trainer_extension_points(data: TextData, tmp_path: Path) -> None:
    """A subclass sees every step through after_step (iteration and loss, as TrainResult.losses records them)
    and can change what a step trains on through next_batch: here one fixed batch, whose loss must fall."""
    from typed_transformer.training import Trainer

    seen: list[tuple[int, float]] = []
    drawn: list[tuple[Tensor, Tensor]] = []
    fixed = data.train[:9]
    batch = (torch.stack([fixed[:8]] * 4), torch.stack([fixed[1:9]] * 4))

    class Recording(Trainer):
        def after_step(self, iteration: int, loss: float) -> None:
            seen.append((iteration, loss))
            super().after_step(iteration, loss)

        def next_batch(self) -> tuple[Tensor, Tensor]:
            drawn.append(batch)
            return batch

    config = tiny_train(max_iters=30, batch_size=4, learning_rate=1e-2, min_lr=1e-2, warmup_iters=0)
    result = Recording(tiny_model(data), data, config, tmp_path, progress=False, log=io.StringIO()).run()
    assert [i for i, _ in seen] == list(range(1, 31))
    assert [loss for _, loss in seen] == result.losses
    assert drawn == [batch] * 30  # one global batch per step, from the override
    assert result.losses[-1] < result.losses[0] / 2


def test_training_steps_equal_a_plain_torch_loop(data: TextData, tmp_path: Path) -> None:
    """The Trainer's update (fused AdamW, decay on matrices only, the warmup/cosine rate, clipping) equals a plain
    loop over the same batches with torch's default AdamW (its foreach path), up to float rounding."""
    from typed_transformer.data import get_batch

    config = tiny_train(max_iters=6, warmup_iters=2, grad_clip=0.5, eval_interval=100)
    result = train(tiny_model(data), data, config, tmp_path, progress=False, log=io.StringIO(), peak_flops=1.0)
    assert isinstance(result.losses, list)

    model = tiny_model(data)
    optimizer = torch.optim.AdamW(model.parameter_groups(config.weight_decay), lr=config.learning_rate,
                                  betas=(config.beta1, config.beta2), foreach=True)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    losses = []
    for iteration in range(config.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = gpt_learning_rate(config, iteration)
        x, y = get_batch(data.train, config.batch_size, 8, generator)
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    assert result.losses == pytest.approx(losses, rel=1e-5)
    assert_same_weights(result.model, model, atol=1e-5)
    assert not all(torch.equal(a, b) for a, b in zip(result.model.parameters(), tiny_model(data).parameters(),
                                                       strict=True))  # it trained


def test_one_precision_path_without_none_branches() -> None:
    """float16's GradScaler is built with enabled= and the forward passes run under one autocast context (a
    disabled one for float32): no ``scaler is not None`` or ``autocast is not None`` branch in the app's loops."""
    import re

    from typed_transformer import generation, seq2seq_training, step_loop, training

    for module in (step_loop, training, seq2seq_training, generation):
        source = Path(str(module.__file__)).read_text(encoding="utf-8")
        assert not re.search(r"\b(scaler|autocast) is (not )?None", source), module.__name__
    assert "GradScaler(self.device_type, enabled=" in Path(str(step_loop.__file__)).read_text(encoding="utf-8")
