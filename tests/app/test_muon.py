"""Muon on the hidden matrices (issue 32): the update against a plain float64 reference, the parameter split,
the AdamW half against torch's, the state round trip, resume and checkpoints, and the settings' validation."""

import io
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tests.support.cli import run
from typed_transformer import muon
from typed_transformer.checkpoint import CheckpointError, load_checkpoint
from typed_transformer.config import TrainConfig
from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.muon import MuonAdamW, hidden_matrices, muon_groups, newton_schulz
from typed_transformer.seq2seq import Seq2SeqTransformer
from typed_transformer.training import TrainResult, train

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 12


def reference_muon(weight: Tensor, grads: list[Tensor], *, lr: float, momentum: float, weight_decay: float,
                   steps: int, nesterov: bool = True) -> Tensor:
    """Muon written out plainly in float64, one matrix, one step after another (the docs' equation)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    w, m = weight.double(), torch.zeros_like(weight, dtype=torch.float64)
    rows, cols = w.shape
    for g in grads:
        g = g.double()
        m = momentum * m + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * m if nesterov else m
        x = u.T if rows > cols else u
        x = x / (torch.linalg.norm(x) + 1e-7)
        for _ in range(steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        o = x.T if rows > cols else x
        w = w * (1 - lr * weight_decay) - lr * math.sqrt(max(1.0, rows / cols)) * o
    return w


@pytest.mark.parametrize("steps", [5, 3])
def test_the_update_equals_a_plain_float64_reference(steps: int) -> None:
    torch.manual_seed(0)
    # two matrices of one shape (orthogonalised in one batched product) and a tall and a wide one
    shapes = [(6, 4), (6, 4), (9, 3), (3, 7)]
    weights = [nn.Parameter(torch.randn(*shape)) for shape in shapes]
    initial = [w.detach().clone() for w in weights]
    grads = [[torch.randn(*shape) for _ in range(4)] for shape in shapes]
    optimizer = MuonAdamW([{"params": weights, "muon": True, "lr_scale": 2.0}], lr=0.01, weight_decay=0.1,
                          ns_steps=steps)
    for k in range(4):
        for w, g in zip(weights, grads, strict=True):
            w.grad = g[k].clone()
        optimizer.step()
    for w, w0, g in zip(weights, initial, grads, strict=True):
        expected = reference_muon(w0, g, lr=0.02, momentum=0.95, weight_decay=0.1, steps=steps)
        torch.testing.assert_close(w.detach().double(), expected, rtol=0, atol=2e-5)
        # the tolerance tells Muon from Muon without Nesterov's look-ahead
        plain = reference_muon(w0, g, lr=0.02, momentum=0.95, weight_decay=0.1, steps=steps, nesterov=False)
        assert (plain - expected).abs().max() > 1e-3


def test_newton_schulz_takes_the_singular_values_near_one_and_keeps_the_directions() -> None:
    torch.manual_seed(1)
    u = torch.randn(3, 16, 48) * torch.tensor([1e-3, 1.0, 1e3])[:, None, None]  # any scale
    o = newton_schulz(u)
    values = torch.linalg.svdvals(o)
    assert float(values.min()) > 0.6
    assert float(values.max()) < 1.25
    p, _, q = torch.linalg.svd(u, full_matrices=False)
    torch.testing.assert_close(o, p @ q, rtol=0, atol=0.35)  # about P Q^T, not exactly


def test_the_split_gives_muon_the_hidden_matrices_only() -> None:
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=True))
    names = {id(p): name for name, p in model.named_parameters()}
    hidden = {names[id(p)] for p in hidden_matrices(model, [model.lm_head])}
    assert hidden == {f"blocks.{i}.{name}.weight" for i in range(2)
                      for name in ("attn.in_proj", "attn.out_proj", "mlp.linear1", "mlp.linear2")}
    groups = muon_groups(model, [model.lm_head], weight_decay=0.1, lr_scale=3.0)
    assert [(g["muon"], g["weight_decay"]) for g in groups] == [(True, 0.1), (False, 0.1), (False, 0.0)]
    assert {names[id(p)] for p in groups[1]["params"]} == {"tok_emb.weight", "pos.weight"}  # the head is tied
    assert all(p.dim() == 1 for p in groups[2]["params"])
    listed = [id(p) for g in groups for p in g["params"]]
    assert sorted(listed) == sorted(names)
    assert len(listed) == len(set(listed))
    untied = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, tie_weights=False))
    assert id(untied.lm_head.weight) not in {id(p) for p in hidden_matrices(untied, [untied.lm_head])}
    seq = Seq2SeqTransformer(7, 9, 0, 0, d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=32)
    seq_hidden = {id(p): p for p in hidden_matrices(seq, [seq.output_projection])}
    assert id(seq.output_projection.weight) not in seq_hidden
    assert id(seq.src_embedding.weight) not in seq_hidden
    assert seq_hidden
    assert all(p.dim() == 2 for p in seq_hidden.values())


def test_the_adamw_half_is_torchs_fused_adamw() -> None:
    torch.manual_seed(2)
    ours = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(4))]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = MuonAdamW([{"params": ours[:1], "muon": False, "weight_decay": 0.1},
                           {"params": ours[1:], "muon": False}], lr=1e-2)
    reference = torch.optim.AdamW([{"params": theirs[:1], "weight_decay": 0.1},
                                   {"params": theirs[1:], "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.99),
                                  fused=True)
    for _ in range(3):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        optimizer.step()
        reference.step()
    for p, q in zip(ours, theirs, strict=True):
        assert torch.equal(p, q)


def test_the_state_dict_round_trips() -> None:
    torch.manual_seed(3)

    def build() -> tuple[list[nn.Parameter], MuonAdamW]:
        params = [nn.Parameter(torch.ones(4, 6)), nn.Parameter(torch.ones(6))]
        return params, MuonAdamW([{"params": params[:1], "muon": True}, {"params": params[1:], "muon": False}],
                                 lr=0.01)

    grads = [[torch.randn(4, 6), torch.randn(6)] for _ in range(4)]
    full, optimizer = build()
    half, first = build()
    for k, (g0, g1) in enumerate(grads):
        for params, opt in ((full, optimizer), (half, first)):
            if opt is first and k >= 2:
                continue
            params[0].grad, params[1].grad = g0.clone(), g1.clone()
            opt.step()
    assert set(first.state_dict()["state"][0]) == {"momentum_buffer"}
    again, resumed = build()
    with torch.no_grad():
        for p, q in zip(again, half, strict=True):
            p.copy_(q)
    resumed.load_state_dict(first.state_dict())
    for g0, g1 in grads[2:]:
        again[0].grad, again[1].grad = g0.clone(), g1.clone()
        resumed.step()
    for p, q in zip(again, full, strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(("settings", "message"), [
    ({"ns_steps": 0}, "ns_steps must be a positive integer"),
    ({"momentum": 1.0}, "momentum and betas must be in"),
    ({"lr_scale": 0.0}, "lr_scale > 0"),
    ({"weight_decay": -1.0}, "weight_decay and eps must be >= 0"),
])
def test_bad_group_settings_are_named(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MuonAdamW([{"params": [nn.Parameter(torch.ones(2, 2))], "muon": True, **settings}], lr=0.01)
    with pytest.raises(ValueError, match="matrices only"):
        MuonAdamW([{"params": [nn.Parameter(torch.ones(2))], "muon": True}], lr=0.01)


def _tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=TextData.from_text(TEXT, 8).tokenizer.vocab_size, block_size=8, n_layer=2,
                         n_head=2, n_embd=16, dropout=0.1))


def _config(**overrides: Any) -> TrainConfig:
    fields: dict[str, Any] = {"max_iters": 10, "batch_size": 4, "eval_interval": 5, "eval_iters": 1,
                              "checkpoint_interval": 100, "warmup_iters": 2, "sample_tokens": 0,
                              "learning_rate": 3e-3, "min_lr": 3e-4, "lr_decay_iters": 10, "optimizer": "muon",
                              "threads": 1}
    return TrainConfig(**{**fields, **overrides})


def _train(out: Path, resume: Path | None = None, stop: int | None = None) -> TrainResult:
    def on_step(iteration: int) -> None:
        if iteration == stop:
            os.kill(os.getpid(), signal.SIGINT)

    data = TextData.from_text(TEXT, 8)
    if resume is None:
        return train(_tiny(), data, _config(), out, progress=False, log=io.StringIO(), peak_flops=1e9,
                     on_step=on_step)
    checkpoint = load_checkpoint(resume)
    return train(checkpoint.model, data, _config(), out, resume=checkpoint, progress=False, log=io.StringIO(),
                 peak_flops=1e9)


def test_resuming_a_muon_run_is_bit_identical_to_the_uninterrupted_run(tmp_path: Path) -> None:
    whole = _train(tmp_path / "whole")
    first = _train(tmp_path / "first", stop=6)
    assert first.interrupted
    assert first.iteration == 6
    saved = load_checkpoint(tmp_path / "first")
    assert saved.optimizer_state is not None
    buffers = [entry for entry in saved.optimizer_state["state"].values() if "momentum_buffer" in entry]
    assert len(buffers) == 8  # 2 layers x (qkv, out, fc, mlp-proj)
    assert all(float(entry["momentum_buffer"].abs().sum()) > 0 for entry in buffers)
    resumed = _train(tmp_path / "resumed", resume=tmp_path / "first")
    assert resumed.iteration == 10
    assert resumed.history == whole.history
    for (name, a), b in zip(resumed.model.state_dict().items(), whole.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_muon_checkpoint_with_a_bad_momentum_buffer_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _train(tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.safetensors"
    saved = load_checkpoint(tmp_path / "run")
    assert saved.optimizer_state is not None
    index = next(i for i, entry in saved.optimizer_state["state"].items() if "momentum_buffer" in entry)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    tensors[f"optim.{index}.momentum_buffer"] = tensors[f"optim.{index}.momentum_buffer"].double()
    from typed_transformer.run_files import content_digest

    metadata["sha256"] = content_digest(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(CheckpointError, match=f"optimizer tensor {index}.momentum_buffer must be torch.float32"):
        load_checkpoint(tmp_path / "run")


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="optimizer must be adamw or muon, got 'sgd'"):
        TrainConfig(optimizer="sgd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"muon_lr must be in \(0, 1\]"):
        TrainConfig(muon_lr=2.0)
    assert TrainConfig().optimizer == "adamw"


@pytest.mark.parametrize(("command", "flags", "message"), [
    ("train", ["--optimizer", "sgd"], "argument --optimizer: invalid choice: 'sgd' (choose from 'adamw', 'muon')"),
    ("train", ["--ns-steps", "0"], "argument --ns-steps: expected an integer from 1 to 100, got '0'"),
    ("train-seq2seq", ["--task", "reverse", "--optimizer", "adamw"],
     "argument --optimizer: invalid choice: 'adamw' (choose from 'adam', 'muon')"),
])
def test_a_bad_optimizer_on_the_command_line_is_one_line(command: str, flags: list[str], message: str,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    data = ["--data", str(text)] if command == "train" else []
    assert run([command, *data, *flags, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_a_seq2seq_muon_run_resumes_bit_identical_and_keeps_its_momentum(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from typed_transformer.seq2seq_training import load_seq2seq

    tiny = ["--task", "reverse", "--max-len", "4", "--d-model", "16", "--nhead", "2", "--layers", "1",
            "--dim-feedforward", "32", "--batch-size", "8", "--eval-pairs", "8", "--eval-interval", "5",
            "--optimizer", "muon"]
    assert run(["train-seq2seq", *tiny, "--max-iters", "10", "--out", str(tmp_path / "straight")]) == 0
    assert run(["train-seq2seq", *tiny, "--max-iters", "5", "--out", str(tmp_path / "resumed")]) == 0
    half = load_seq2seq(tmp_path / "resumed")
    assert half.optimizer_state is not None
    assert any("momentum_buffer" in entry for entry in half.optimizer_state["state"].values())
    assert run(["train-seq2seq", *tiny, "--max-iters", "10", "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    straight, resumed = load_seq2seq(tmp_path / "straight"), load_seq2seq(tmp_path / "resumed")
    assert straight.config.optimizer == "muon"
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    capsys.readouterr()


@pytest.mark.parametrize(("shape", "gram_form"), [((128, 384), True), ((512, 128), True), ((128, 128), False),
                                                   ((96, 144), False)])
def test_the_gram_form_runs_where_it_costs_fewer_flops(shape: tuple[int, int], gram_form: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Only for matrices more than 1.5x longer than wide (the module's FLOP count), and it agrees with the
    step-by-step iteration to float32 rounding."""
    calls: list[torch.Size] = []
    real = muon._gram_form

    def spy(x: Tensor, steps: int) -> Tensor:
        calls.append(x.shape)
        return real(x, steps)

    monkeypatch.setattr(muon, "_gram_form", spy)
    torch.manual_seed(2)
    u = torch.randn(2, *shape)
    o = newton_schulz(u)
    assert bool(calls) == gram_form
    x = u.mT if shape[0] > shape[1] else u
    x = x / torch.linalg.matrix_norm(x, keepdim=True)
    for _ in range(5):
        a = x @ x.mT
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    torch.testing.assert_close(o, x.mT if shape[0] > shape[1] else x, rtol=0, atol=2e-5)
