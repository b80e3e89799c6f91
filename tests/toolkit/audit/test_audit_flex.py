"""FlexAttention's mods audited with zero lines (typed_transformer.audit.kernels.flex): each correct mod of
tests/support/mods.py is read as the reference's variant and passes; each planted bug FAILs the row of its mod with
the cause named; a mod that matches no variant is a finding; flex_attention behind SDPA's call passes the function
audit, its missing backward on the CPU inferred and listed."""

import functools
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.support import mods
from typed_transformer.audit import audit_attention, audit_flex, infer_conventions
from typed_transformer.audit.kernels.flex import (
    FlexVariant,
    classify_keep,
    closed_over,
    flex_reference,
    flex_sdpa,
    variant_keep,
)
from typed_transformer.positions import alibi_slopes

TOP_LEFT = {"causal_alignment": "top-left"}


@pytest.mark.parametrize(("kwargs", "mask", "score"), [
    ({"mask_mod": mods.causal, "known": TOP_LEFT}, "causal (j <= i)", None),
    ({"mask_mod": mods.sliding_window, "known": TOP_LEFT}, "a causal sliding window of 4 keys (i - 4 < j <= i)",
     None),
    ({"mask_mod": mods.document}, "documents [0, 3), [3, 8), [8, 16)", None),
    ({"mask_mod": mods.causal_document}, "causal documents [0, 3), [3, 8), [8, 16)", None),
    ({"score_mod": mods.alibi_6, "mask_mod": mods.causal, "known": TOP_LEFT}, "causal (j <= i)",
     "ALiBi (distance form), scale 1/sqrt(d)"),
    ({"score_mod": mods.alibi_8}, None, "ALiBi (distance form), scale 1/sqrt(d)"),
    ({"score_mod": mods.softcap}, None, "soft-cap 50, scale 1/sqrt(d)"),
])
def test_a_correct_mod_is_read_as_the_references_variant_and_passes(kwargs: dict[str, Any], mask: str | None,
                                                                      score: str | None) -> None:
    report = audit_flex(**kwargs)
    assert report.passed, report.table()
    assert report.status("reference") == "PASS"
    assert report["mask_mod"].message == (mask or "no mask_mod")
    assert report["score_mod"].message == (score or "no score_mod")
    assert report.status("gradients") == "SKIP"  # flex_attention has no backward on the CPU
    assert any(u.startswith("gradients (flex_attention refused its backward on cpu") for u in report.untested)


def test_a_causal_mod_counts_queries_from_zero_an_undeclared_top_left_alignment() -> None:
    report = audit_flex(mask_mod=mods.causal)
    assert report.failed == []
    assert report.undeclared == ["causal_alignment"]
    assert not report.passed
    assert "t = 16, s = 32: query i keeps keys j <= i" in report.differences[0].seen


def test_a_window_off_by_one_fails_the_mask_row_naming_the_window_it_reads() -> None:
    report = audit_flex(mask_mod=mods.window_off_by_one, known=TOP_LEFT)
    assert report.status("mask_mod") == "FAIL"
    assert report["mask_mod"].message.startswith(
        "window: off by +1: the mod reads WINDOW = 4, but each query keeps 5 keys")
    assert report.status("reference") == "FAIL"  # held to the 4 keys its WINDOW says
    assert "against the reference of a causal sliding window of 4 keys" in report["reference"].message
    assert report["mask_mod"].repro is not None
    assert "from tests.support.mods import window_off_by_one as mask_mod" in report["mask_mod"].repro
    declared = audit_flex(mask_mod=mods.window_off_by_one, known={**TOP_LEFT, "window": 5})
    assert declared.passed, declared.table()  # 5 keys declared: what it computes


def test_alibi_slopes_of_the_power_of_two_rule_for_six_heads_fail_the_score_row() -> None:
    report = audit_flex(score_mod=mods.alibi_power_of_two_slopes_6)
    assert report.status("score_mod") == "FAIL"
    message = report["score_mod"].message
    assert message.startswith("alibi: the slopes are not the paper's for 6 heads: 2^(-8 i / 6) is the paper's rule "
                              "for a power of two only")
    assert "the paper's: 0.25, 0.0625, 0.01562, 0.003906, 0.5, 0.125" in message
    assert report.status("reference") == "FAIL"
    assert "heads = 6: the mods take up to 6 heads (7 raise IndexError" in "\n".join(report.inferred)


def test_a_soft_cap_before_the_scale_fails_the_score_row() -> None:
    report = audit_flex(score_mod=mods.softcap_before_scale, scale=1.0)
    assert report.status("score_mod") == "FAIL"
    assert report["score_mod"].message == (
        "softcap: the soft-cap runs before the scale: logits saturate at 12.5 = 50 x 0.25 (the scale), not at SOFTCAP "
        "= 50; Gemma 2 caps the scaled logits, c tanh(s q.k / c)")
    assert report.status("reference") == "FAIL"
    assert "head size 16 (HEAD_DIM): the only size probed" in "\n".join(report.inferred)


def test_the_correct_order_with_the_scale_inside_the_mod_passes() -> None:
    report = audit_flex(score_mod=mods.softcap_scale_inside, scale=1.0)
    assert report.passed, report.table()
    assert report["score_mod"].message == "soft-cap 50, scale 1/sqrt(d)"


def test_mods_that_match_no_variant_are_findings() -> None:
    def same_parity(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx % 2 == kv_idx % 2

    def quadratic_bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - 0.01 * (q_idx - kv_idx) ** 2

    def cubed(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + 0.001 * score**3

    parity = audit_flex(mask_mod=same_parity)
    assert parity["mask_mod"].message.startswith("the keys kept at t = s = 32 are none of every key, causal, a sliding "
                                                 "window, a two-sided window or documents (query 0: keys [0, 2, 4")
    assert audit_flex(score_mod=quadratic_bias)["score_mod"].message.startswith(
        "a bias on zero logits that is neither none nor ALiBi's")
    assert audit_flex(score_mod=cubed)["score_mod"].message.startswith(
        "a transform of the logits that is neither a scale nor a tanh soft-cap")


def test_a_two_sided_window_and_a_constant_scale() -> None:
    radius = 2

    def local(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx - kv_idx).abs() <= radius

    report = audit_flex(mask_mod=local, scale=0.5, known={"scale": 0.5, "causal_alignment": "top-left"})
    assert report["mask_mod"].message == "a two-sided window of radius 2 (|i - j| <= 2)"
    assert report.passed, report.table()
    undeclared = audit_flex(mask_mod=local, scale=0.5, known=TOP_LEFT)
    assert undeclared.undeclared == ["scale"]


def test_the_compiled_flex_attention_is_held_to_the_same_reference() -> None:
    report = audit_flex(score_mod=mods.softcap, mask_mod=mods.sliding_window, compiled=True, known=TOP_LEFT)
    assert report.status("compiled") == "PASS", report.table()
    assert report.passed


def test_known_takes_only_what_the_mods_compute() -> None:
    with pytest.raises(ValueError, match="audit_flex: known takes window, softcap, scale, causal_alignment, "
                                         "head_size, heads; got layout"):
        audit_flex(mask_mod=mods.causal, known={"layout": "bthd"})


def test_closed_over_numbers_come_from_cells_globals_defaults_and_partials() -> None:
    window = 7

    def cell(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx - kv_idx < window

    def keyword(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor, *, softcap: float = 30.0,
                flag: bool = True) -> Tensor:
        return q_idx >= kv_idx

    assert closed_over(cell) == {"window": 7.0}
    assert closed_over(mods.sliding_window) == {"WINDOW": 4.0}
    assert closed_over(keyword) == {"softcap": 30.0}  # a bool is not a number
    assert closed_over(functools.partial(keyword, softcap=20.0)) == {"softcap": 20.0}


def test_the_variants_keys_against_their_rules_written_out() -> None:
    t, s = 3, 6
    p = torch.arange(t)[:, None] + s - t
    j = torch.arange(s)[None, :]
    window = FlexVariant("window", window=2, alignment="bottom-right")
    assert torch.equal(variant_keep(window, t, s), (j <= p) & (j > p - 2))
    top_left = FlexVariant("causal", alignment="top-left")
    assert torch.equal(variant_keep(top_left, t, s), j <= torch.arange(t)[:, None])
    documents = FlexVariant("documents", documents=(0, 0, 1, 1, 1, 2))
    ids = torch.tensor(documents.documents)
    assert torch.equal(variant_keep(documents, 6, 6), ids[:, None] == ids[None, :])
    for variant in (FlexVariant("causal"), FlexVariant("window", window=3), FlexVariant("two-sided window", window=1),
                    documents, FlexVariant("causal documents", documents=(0, 0, 1, 1, 1, 2))):
        assert classify_keep(variant_keep(variant, 6, 6)) == variant


def test_the_flex_reference_against_alibi_written_out() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    variant = FlexVariant("causal", alibi="key", alignment="bottom-right", softcap=3.0)
    logits = q @ k.transpose(-1, -2) / 2.0
    logits = 3.0 * torch.tanh(logits / 3.0) + alibi_slopes(6)[:, None, None] * torch.arange(5.0)
    logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    assert torch.allclose(flex_reference(variant, q, k, v), logits.softmax(-1) @ v, rtol=0, atol=1e-12)


def test_flex_attention_behind_sdpas_call_passes_and_its_missing_backward_is_inferred() -> None:
    inference = infer_conventions(flex_sdpa)
    assert inference.findings == []
    assert inference.conventions.supports_autograd is False
    assert inference.evidence["supports_autograd"].seen.startswith(
        "h=1, t=3, s=4, d=4: its backward raised NotImplementedError: FlexAttention does not support backward on CPU")
    assert inference.conventions.enable_gqa is True
    report = audit_attention(flex_sdpa, conventions="infer", budget="quick", max_examples=4, dtypes=[torch.float64])
    assert report.passed, report.table()
    assert "gradients (supports_autograd=False)" in report.untested


def test_an_inference_only_kernel_is_audited_without_gradients() -> None:
    def no_grad_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                          is_causal: bool = False) -> Tensor:
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    inference = infer_conventions(no_grad_attention)
    assert inference.evidence["supports_autograd"].seen == (
        "h=1, t=3, s=4, d=4: its output carries no gradient (requires_grad=False) (gradients are not tested)")


def test_a_backward_that_breaks_is_no_refusal_and_fails_the_gradient_check() -> None:
    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> Tensor:
            raise IndexError("a bug in the backward")

    def broken_backward(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        applied: Tensor = Broken.apply(out)  # type: ignore[no-untyped-call]
        return applied

    inference = infer_conventions(broken_backward)
    assert "supports_autograd" not in inference.evidence
    report = audit_attention(broken_backward, conventions="infer", budget="quick", max_examples=2,
                             dtypes=[torch.float64], checks=["gradients"])
    assert report.status("gradients") == "FAIL"
