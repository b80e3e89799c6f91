"""The checks added for real attention code (issue 10): each catches the planted bug it is for, and correct
candidates with narrower support pass once they declare it."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.support import audit_candidates as cands
from typed_transformer import scaled_dot_product_attention
from typed_transformer.audit import Conventions, Example, audit_attention
from typed_transformer.audit.core.examples import bound, error

OURS = Conventions()  # ours, without grouped-query attention (the naive candidates have none)


@pytest.mark.parametrize(
    ("candidate", "check", "dtypes"),
    [
        (cands.no_max_subtraction, "large_logits", (torch.float32,)),
        (cands.finite_fill, "large_logits", (torch.float32, torch.float64)),
        (cands.drops_mask_when_causal, "mask_and_causal", (torch.float32, torch.float64)),
        (cands.first_head_mask, "masking", (torch.float32, torch.float64)),
        (cands.nan_grad_rows, "gradients", (torch.float32, torch.float64)),
    ],
    ids=["no-max-subtraction", "finite-fill", "mask-dropped-when-causal", "per-head-mask", "nan-gradients"],
)
def test_planted_bug_fails_its_new_check(candidate: Callable[..., Tensor], check: str,
                                         dtypes: tuple[torch.dtype, ...]) -> None:
    for seed in range(3):
        report = audit_attention(candidate, conventions=OURS, checks=[check], max_examples=10, seed=seed,
                                 dtypes=dtypes, budget="quick")
        assert report.failed == [check], report.table()


@pytest.mark.parametrize(
    "candidate", [cands.no_max_subtraction, cands.finite_fill, cands.drops_mask_when_causal, cands.first_head_mask,
                  cands.nan_grad_rows],
    ids=["no-max-subtraction", "finite-fill", "mask-dropped-when-causal", "per-head-mask", "nan-gradients"])
def test_the_new_bugs_pass_every_check_but_theirs(candidate: Callable[..., Tensor]) -> None:
    """None of them is caught by the checks that existed before (why the new checks are needed)."""
    old = ["reference", "scale", "causality", "batch_independence", "permutation", "padding", "fully_masked"]
    report = audit_attention(candidate, conventions=OURS, checks=old, max_examples=10, budget="quick")
    assert report.passed, report.table()


def test_no_max_subtraction_gives_nan_at_logits_around_90() -> None:
    q = torch.full((1, 1, 1, 1), 9.6)
    k = torch.full((1, 1, 2, 1), 9.6)
    v = torch.randn(1, 1, 2, 3)
    assert cands.no_max_subtraction(q, k, v).isnan().all()  # logits 92: exp overflows float32
    ours = scaled_dot_product_attention(q, k, v)
    assert isinstance(ours, Tensor)
    assert torch.isfinite(ours).all()


def test_large_logits_reach_at_least_100() -> None:
    seen: list[float] = []

    def spy(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        seen.append(float((q @ k.transpose(-1, -2)).abs().max()) / q.shape[-1] ** 0.5)
        out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        assert isinstance(out, Tensor)
        return out

    report = audit_attention(spy, conventions=OURS, checks=["large_logits"], max_examples=10, dtypes=[torch.float32],
                             budget="quick")
    assert report.passed, report.table()
    assert min(seen) >= 20, seen
    assert sorted(seen)[len(seen) // 2] >= 100, seen


# ----------------------------------------------------------------------------------------------------
# Conventions: what a candidate supports
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "declared", "untested"),
    [
        (cands.self_attention_only, Conventions(self_attention=True, equal_head_sizes=True),
         {"t != s and separate key/value inputs (self_attention=True)", "dv != d (equal_head_sizes=True)"}),
        (cands.even_heads_in_range, Conventions(even_head_size=True, head_sizes=(2, 6), lengths=(2, 5)),
         {"odd head sizes (even_head_size=True)", "head sizes outside 2..6 (head_sizes)",
          "lengths outside 2..5 (lengths)"}),
        (cands.interleaved_groups, Conventions(supports_gqa=True, grouping="r g"), set()),
        (cands.additive_only, Conventions(mask_kind="additive"),
         {"boolean masks (mask_kind='additive': masks passed as 0/-inf floats)"}),
        (cands.decode_sees_all, Conventions(causal_alignment="top-left", decode_sees_all=True, fully_masked="any",
                                            mask_with_causal=False),
         {"causal alignment of a single query (decode_sees_all=True)"}),
    ],
    ids=["self-attention", "even-head-sizes-and-ranges", "r-g-grouping", "additive-masks", "decode-rule"],
)
def test_declared_support_is_all_that_is_drawn(candidate: Callable[..., Tensor], declared: Conventions,
                                               untested: set[str]) -> None:
    default = Conventions(supports_gqa=declared.supports_gqa, causal_alignment=declared.causal_alignment,
                          fully_masked=declared.fully_masked, mask_with_causal=declared.mask_with_causal)
    undeclared = audit_attention(candidate, conventions=default, max_examples=8, budget="quick")
    assert not undeclared.passed  # without the declaration the candidate fails (it is drawn what it refuses)
    report = audit_attention(candidate, conventions=declared, max_examples=8, budget="quick")
    assert report.passed, report.table()
    assert untested <= set(report.untested)
    for note in untested:
        assert note in report.table()


def test_grouping_order_is_checked() -> None:
    """The (g r) reference grouping declared for an (r g) candidate fails, and the other way round."""
    bad = audit_attention(cands.interleaved_groups, conventions=Conventions(supports_gqa=True),
                          checks=["reference"], max_examples=10, budget="quick")
    assert bad.failed == ["reference"]
    bad = audit_attention(scaled_dot_product_attention, conventions=Conventions(supports_gqa=True, grouping="r g"),
                          checks=["reference"], max_examples=10, budget="quick")
    assert bad.failed == ["reference"]


def test_decode_rule_without_the_declaration_fails_causality() -> None:
    report = audit_attention(cands.decode_sees_all, checks=["causality"], max_examples=10,
                             conventions=Conventions(causal_alignment="top-left", fully_masked="any"), budget="quick")
    assert report.failed == ["causality"]


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match=r"head_sizes must be \(low, high\) with 1 <= low <= high"):
        Conventions(head_sizes=(4, 2))
    with pytest.raises(ValueError, match="grouping must be one of g r, r g"):
        Conventions(grouping="gr")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------
# Tolerance: the float64 false alarm
# ----------------------------------------------------------------------------------------------------


def test_float64_tolerance_allows_the_reference_rounding() -> None:
    """Issue 10's false alarm: b=h=g=t=1, s=6, d=5, error 6.66e-16 (3 ulp) against an allowance of 6.11e-16.
    The floor now scales with the length of the sums, so a few ulp pass in float64 while a real bug fails."""
    ref = torch.ones(1, 1, 1, 5, dtype=torch.float64)
    allowed, _ = bound(ref, ref, 2.0, torch.float64, amplification=1.37, length=6 + 5)
    assert allowed > 6.66e-16
    assert allowed < 1e-13


@pytest.mark.parametrize("seed", range(3))
def test_correct_float64_candidates_raise_no_false_alarm(seed: int) -> None:
    """A quick version of benchmarks/audit_false_alarms.py (100 seeds there)."""
    for candidate, conventions in ((F.scaled_dot_product_attention, Conventions.torch_sdpa()),
                                   (cands.naive_attention, Conventions(causal_alignment="top-left",
                                                                       fully_masked="nan"))):
        report = audit_attention(candidate, conventions=conventions, dtypes=[torch.float64], seed=seed,
                                 max_examples=8, checks=["reference", "permutation", "batch_independence"],
                                 budget="quick")
        assert report.passed, report.table()


def test_error_matches_nan_to_nan_only() -> None:
    expected = torch.tensor([1.0, float("nan")])
    assert error(torch.tensor([1.0, float("nan")]), expected) == 0.0
    assert error(torch.tensor([1.0, 0.0]), expected) == float("inf")
    assert error(torch.tensor([float("nan"), float("nan")]), expected) == float("inf")


def test_counterexample_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    report = audit_attention(cands.drops_mask_when_causal, conventions=OURS, checks=["mask_and_causal"],
                             max_examples=10, budget="quick")
    result = report["mask_and_causal"]
    assert result.counterexample is not None
    example = Example(**result.counterexample)
    q, k, v = example.inputs()
    keep = example.mask()
    assert keep is not None
    assert example.is_causal
    dtype = example.torch_dtype
    got = cands.drops_mask_when_causal(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=keep, is_causal=True)
    want = scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True)
    assert isinstance(want, Tensor)
    assert not torch.allclose(got.double(), want, atol=1e-3)


def test_declared_lengths_hold_in_every_check() -> None:
    seen: list[tuple[int, int]] = []

    def spy(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        seen.append((q.shape[-2], k.shape[-2]))
        return cands.even_heads_in_range(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    conventions = Conventions(even_head_size=True, head_sizes=(2, 6), lengths=(2, 5))
    report = audit_attention(spy, conventions=conventions, max_examples=5, budget="quick")
    assert report.passed, report.table()
    assert all(2 <= t <= 5 and 2 <= s <= 5 for t, s in seen)


def test_declared_nan_rows_do_not_fail_gradients_through_them() -> None:
    """A textbook -inf fill + softmax with bottom-right causal masks gives NaN rows when t > s; declared
    ``fully_masked="nan"``, the gradient check leaves those rows out (they carry NaN into dk and dv too) and the
    report says so, instead of failing with an infinite error."""
    conventions = Conventions(fully_masked="nan")
    report = audit_attention(cands.nan_rows, conventions=conventions, checks=["gradients", "causality"],
                             max_examples=25, budget="quick")
    assert report.passed, report.table()
    assert any("gradients through fully masked rows" in note for note in report.untested)
    # the causal forward still sees the NaN rows (t > s is drawn there) and they match the declaration
    assert audit_attention(cands.nan_rows, conventions=Conventions(), checks=["causality"], max_examples=25,
                           budget="quick").failed
