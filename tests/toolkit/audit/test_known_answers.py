"""The reference's known-answer self-test: the stored values are right (checked against torch's own attention and
written-out formulas), and an audit refuses to run when something the reference reaches no longer gives them."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from typed_transformer.audit import AuditUsageError, audit_attention
from typed_transformer.audit.core import known_answers as K
from typed_transformer.cli import main

ROOT = Path(__file__).resolve().parents[3]


def _stored(name: str, shape: tuple[int, ...]) -> Tensor:
    return torch.tensor(K.stored()[name], dtype=torch.float64).reshape(shape)


def _qkv(h: int = 2, t: int = 3, s: int = 4) -> tuple[Tensor, Tensor, Tensor]:
    return K.grid(1, h, t, 4, phase=0.1), K.grid(1, 2, s, 4, phase=0.2), K.grid(1, 2, s, 3, phase=0.3)


def test_the_stored_values_are_torchs_attention_under_each_convention() -> None:
    q, k, v = _qkv()
    torch.testing.assert_close(_stored("plain", (1, 2, 3, 3)), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(_stored("scale 0.5", (1, 2, 3, 3)), F.scaled_dot_product_attention(q, k, v, scale=0.5))
    q2, k2, v2 = _qkv(t=2)
    torch.testing.assert_close(_stored("causal, top-left, t < s", (1, 2, 2, 3)),
                               F.scaled_dot_product_attention(q2, k2, v2, is_causal=True))
    bottom_right = torch.ones(2, 4, dtype=torch.bool).tril(diagonal=2)
    torch.testing.assert_close(_stored("causal, bottom-right, t < s", (1, 2, 2, 3)),
                               F.scaled_dot_product_attention(q2, k2, v2, attn_mask=bottom_right))
    q4, k3, v3 = _qkv(t=4, s=3)
    late = F.scaled_dot_product_attention(q4[:, :, 1:], k3, v3, attn_mask=torch.ones(3, 3, dtype=torch.bool).tril())
    want = torch.cat([torch.zeros(1, 2, 1, 3, dtype=torch.float64), late], dim=2)  # query 0 sees no key: zeros
    torch.testing.assert_close(_stored("causal, bottom-right, t > s (a row without keys: zeros)", (1, 2, 4, 3)), want)
    qg = K.grid(1, 4, 3, 4, phase=0.1)
    torch.testing.assert_close(_stored("grouped-query, 4 heads on 2", (1, 4, 3, 3)),
                               F.scaled_dot_product_attention(qg, k, v, enable_gqa=True))
    bias = K.grid(1, 2, 3, 4, phase=0.5)
    torch.testing.assert_close(_stored("additive bias", (1, 2, 3, 3)),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_the_stored_values_of_masked_rows_soft_caps_and_rotary_are_the_written_out_formulas() -> None:
    q, k, v = _qkv()
    keep = K.grid(1, 1, 3, 4, phase=0.4) > -0.3
    keep[..., 0] = True
    dead = keep.clone()
    dead[..., 0, :] = False
    live = F.scaled_dot_product_attention(q, k, v, attn_mask=dead)[:, :, 1:]
    zeros = torch.cat([torch.zeros(1, 2, 1, 3, dtype=torch.float64), live], dim=2)
    torch.testing.assert_close(_stored("keep-mask with a fully masked row (zeros)", (1, 2, 3, 3)), zeros)
    uniform = torch.cat([v.mean(dim=2, keepdim=True), live], dim=2)  # the mean of the values
    torch.testing.assert_close(_stored("keep-mask with a fully masked row (uniform)", (1, 2, 3, 3)), uniform)
    logits = (q @ k.transpose(-1, -2)) / 2.0  # 1/sqrt(4)
    capped = (0.5 * torch.tanh(logits / 0.5)).masked_fill(~keep, -math.inf)
    torch.testing.assert_close(_stored("soft-capped at 0.5, mask", (1, 2, 3, 3)), capped.softmax(-1) @ v)
    x = K.grid(1, 2, 3, 4, phase=0.6)
    for name, offset, pairs in (("rotary, half", 0, ((0, 2), (1, 3))),
                                ("rotary, interleaved, offset 2", 2, ((0, 1), (2, 3)))):
        want = x.clone()
        for i, (a, b) in enumerate(pairs):
            angle = torch.arange(offset, offset + 3, dtype=torch.float64) * 10000.0 ** (-i / 2)
            cos, sin = angle.cos()[:, None], angle.sin()[:, None]
            want[..., a:a + 1] = x[..., a:a + 1] * cos - x[..., b:b + 1] * sin
            want[..., b:b + 1] = x[..., b:b + 1] * cos + x[..., a:a + 1] * sin
        torch.testing.assert_close(_stored(name, (1, 2, 3, 4)), want)
    assert K.stored()["error, NaN where NaN is"] == [1.0]


def test_the_reference_passes_its_self_test_and_the_file_is_what_the_script_writes() -> None:
    assert K.self_test() == []
    assert set(K.stored()) == set(K.compute())
    done = subprocess.run([sys.executable, "benchmarks/known_answers.py"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(f"0 of {len(K.stored())} cases differ from the stored values")


def _textbook(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def test_an_audit_refuses_to_run_when_a_function_outside_the_trusted_list_changed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """torch.Tensor.tril is not among the trusted functions; both causal masks are built with it. A candidate that
    made it the identity would turn the reference's causal attention into plain attention."""
    real = Tensor.tril
    monkeypatch.setattr(Tensor, "tril", lambda self, *args, **kwargs: self.clone())
    with pytest.raises(AuditUsageError, match=r"known-answer self-test failed: causal, bottom-right, t < s \(differs "
                                              r"by 0\.0927\); causal, top-left, t < s \(differs by 0\.729\)"):
        audit_attention(_textbook, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert main(["audit", "tests.toolkit.audit.test_known_answers:_textbook", "--checks", "reference",
                 "--budget", "quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "the reference's known-answer self-test failed: causal, bottom-right, t < s" in err[0]
    monkeypatch.setattr(Tensor, "tril", real)
    assert audit_attention(_textbook, checks=["reference"], dtypes=(torch.float64,), budget="quick").passed
