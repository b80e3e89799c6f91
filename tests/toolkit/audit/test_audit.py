"""The audit toolkit: planted bugs fail the right check, correct candidates in every convention pass."""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.support import audit_candidates as cands
from typed_transformer import scaled_dot_product_attention
from typed_transformer.audit import (
    FUNCTION_CHECKS,
    AuditCase,
    AuditUsageError,
    Conventions,
    Example,
    audit_attention,
    candidate_call,
    parametrize_audit,
    takes_enable_gqa,
)

SDPA = Conventions.torch_sdpa()
NAIVE = Conventions(causal_alignment="top-left", fully_masked="nan")


@pytest.mark.parametrize(
    ("candidate", "conventions", "check"),
    [
        (cands.missing_scale, NAIVE, "scale"),
        (cands.missing_scale, NAIVE, "reference"),
        (cands.softmax_wrong_axis, NAIVE, "reference"),
        (cands.causal_off_by_one, NAIVE, "causality"),
        (cands.heads_wrong_view, SDPA, "batch_independence"),
        (cands.flipped_polarity, NAIVE, "masking"),
        (cands.padding_ignored, NAIVE, "padding"),
        (cands.half_softmax, NAIVE, "reference"),
        (cands.nan_rows, Conventions(), "fully_masked"),
    ],
    ids=["missing-scale", "missing-scale-ref", "softmax-axis", "causal-off-by-one", "heads-view", "mask-polarity",
         "padding-ignored", "fp16-softmax", "nan-rows"],
)
def test_planted_bug_fails_its_check(candidate: Callable[..., Tensor], conventions: Conventions, check: str) -> None:
    report = audit_attention(candidate, conventions=conventions, checks=[check], max_examples=6, budget="quick")
    result = report[check]
    assert result.status == "FAIL", report.table()
    assert report.failed == [check]
    assert not report.passed
    assert result.counterexample is not None
    assert result.repro is not None
    # The counterexample reproduces: the recorded call gives the same failure when audited alone.
    example = Example(**result.counterexample)
    args, _kwargs = candidate_call(example, conventions)
    assert args[0].dtype == example.torch_dtype
    assert "out = candidate(qc, kc, vc" in result.repro  # a plain call, as the audit made it


def test_planted_bugs_fail_every_affected_check_in_a_full_audit() -> None:
    report = audit_attention(cands.causal_off_by_one, conventions=NAIVE, max_examples=6, dtypes=FULL_PRECISION,
                             budget="quick")
    # every check that draws is_causal=True, and only those (in half precision its float16 logits overflow too)
    assert report.failed == ["causality", "mask_and_causal", "gradients"]
    assert report["reference"].status == "PASS"


CORRECT: list[tuple[Callable[..., Any], Conventions, int]] = [
    (scaled_dot_product_attention, Conventions.typed_transformer(), 0),
    (scaled_dot_product_attention, Conventions.typed_transformer(), 1),
    (scaled_dot_product_attention, Conventions.typed_transformer(), 2),
    (F.scaled_dot_product_attention, SDPA, 0),
    (F.scaled_dot_product_attention, SDPA, 1),
    (F.scaled_dot_product_attention, SDPA, 2),
    (cands.naive_attention, NAIVE, 0),
    (cands.bthd_attention, Conventions(layout="bthd"), 0),
    (cands.drop_mask_attention, Conventions(mask_polarity="drop"), 0),
    (cands.unit_scale_attention, Conventions(causal_alignment="top-left", scale=1.0, fully_masked="any",
                                             mask_with_causal=False), 0),
]


@pytest.mark.parametrize(("candidate", "conventions", "seed"), CORRECT,
                         ids=["ours-0", "ours-1", "ours-2", "sdpa-0", "sdpa-1", "sdpa-2", "naive", "bthd", "drop",
                              "unit-scale"])
def test_correct_candidates_pass(candidate: Callable[..., Tensor], conventions: Conventions, seed: int) -> None:
    # the small sizes over several seeds; the default budget's sizes and dtypes: test_audit_depth.py
    report = audit_attention(candidate, conventions=conventions, seed=seed, max_examples=6, dtypes=FULL_PRECISION,
                             budget="quick")
    assert report.passed, report.table()
    expected_skips = {"fully_masked"} if conventions.fully_masked == "any" else set()
    if not conventions.mask_with_causal:
        expected_skips.add("mask_and_causal")
    assert {r.name for r in report.results if r.status == "SKIP"} == expected_skips
    assert list(dict.fromkeys(r.name for r in report.results)) == list(FUNCTION_CHECKS)
    # one row per check and dtype, one row for a skipped check
    assert len(report.results) == 2 * len(FUNCTION_CHECKS) - len(expected_skips)


FULL_PRECISION = (torch.float32, torch.float64)


def test_half_precision_of_the_correct_candidates() -> None:
    """Kernels that accumulate in float32 (ours and torch's SDPA) pass in float16 and bfloat16; the textbook
    attention, whose float16 logits overflow past 65504, fails large_logits there."""
    for candidate, conventions in ((scaled_dot_product_attention, Conventions.typed_transformer()),
                                   (F.scaled_dot_product_attention, SDPA)):
        report = audit_attention(candidate, conventions=conventions, max_examples=4,
                                 dtypes=(torch.float16, torch.bfloat16), budget="quick")
        assert report.passed, report.table()
    naive = audit_attention(cands.naive_attention, conventions=NAIVE, max_examples=4, dtypes=(torch.float16,),
                            budget="quick")
    assert "large_logits" in naive.failed, naive.table()


def test_unsupported_features_are_skipped() -> None:
    conventions = Conventions(supports_mask=False, supports_causal=False, supports_autograd=True)
    report = audit_attention(cands.plain_attention, conventions=conventions, max_examples=6, budget="quick")
    assert report.passed, report.table()
    skipped = {r.name for r in report.results if r.status == "SKIP"}
    assert skipped == {"causality", "masking", "padding", "fully_masked", "mask_and_causal"}
    assert "attention masks (supports_mask=False)" in report.untested
    assert "is_causal (supports_causal=False)" in report.untested


def test_wrong_conventions_fail() -> None:
    # SDPA is top-left: declaring bottom-right must make the causality check fail.
    report = audit_attention(F.scaled_dot_product_attention, checks=["causality"],
                             conventions=Conventions(fully_masked="any"), max_examples=6, budget="quick")
    assert report.failed == ["causality"]
    # Our function with torch's polarity declared: the masking check fails.
    report = audit_attention(scaled_dot_product_attention, checks=["masking"],
                             conventions=Conventions(mask_polarity="drop"), max_examples=6, budget="quick")
    assert report.failed == ["masking"]


def test_no_false_alarms_over_many_seeds() -> None:
    for seed in range(4):
        report = audit_attention(F.scaled_dot_product_attention, conventions=SDPA, seed=seed, max_examples=10,
                                 checks=["reference", "scale", "gradients"], budget="quick")
        assert report.passed, report.table()


def test_report_table_and_json(tmp_path: Path) -> None:
    report = audit_attention(cands.missing_scale, conventions=NAIVE, checks=["scale", "dtype"], max_examples=6,
                             budget="quick")
    table = report.table()
    lines = table.splitlines()
    assert lines[1].split() == ["check", "dtype", "status", "ratio", "detail"]
    assert [line.split()[:3] for line in lines[3:7]] == [["scale", "float32", "FAIL"], ["scale", "float64", "FAIL"],
                                                         ["dtype", "float32", "PASS"], ["dtype", "float64", "PASS"]]
    assert table.endswith("\nfloat32: 1 passed, 1 failed; float64: 1 passed, 1 failed; 1 root cause")
    assert str(report) == table
    path = tmp_path / "audit.json"
    text = report.to_json(str(path))
    data = json.loads(path.read_text())
    assert data == json.loads(text)
    assert data["passed"] is False
    assert [(r["name"], r["dtype"], r["status"]) for r in data["results"]] == [
        ("scale", "float32", "FAIL"), ("scale", "float64", "FAIL"), ("dtype", "float32", "PASS"),
        ("dtype", "float64", "PASS")]
    assert data["results"][0]["ratio"] > 100
    assert data["results"][0]["counterexample"]["d"] >= 16
    assert data["results"][0]["counterexample"]["dtype"] == "float32"
    assert data["results"][1]["counterexample"]["dtype"] == "float64"
    assert data["conventions"]["causal_alignment"] == "top-left"
    assert data["checks_version"] == "4"


def test_a_float64_only_cause_is_one_row() -> None:
    def float32_softmax(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
        weights = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).float().softmax(dim=-1).to(q.dtype)
        out: Tensor = weights @ v
        return out

    report = audit_attention(float32_softmax, conventions=Conventions(supports_mask=False, supports_causal=False),
                             checks=["reference", "permutation"], max_examples=6, budget="quick")
    assert [(r.name, r.dtype, r.status) for r in report.results] == [
        ("reference", "float32", "PASS"), ("reference", "float64", "FAIL"),
        ("permutation", "float32", "PASS"), ("permutation", "float64", "FAIL")]


def test_examples_counts_examples_not_shrinking_calls() -> None:
    report = audit_attention(cands.missing_scale, conventions=NAIVE, checks=["scale", "dtype"], max_examples=7,
                             budget="quick")
    for result in report.results:
        assert 1 <= result.examples <= 7, result
    assert report["dtype"].examples == 7


def test_audit_is_reproducible_for_a_seed() -> None:
    first = audit_attention(cands.causal_off_by_one, conventions=NAIVE, checks=["causality"], seed=3, max_examples=6,
                            budget="quick")
    second = audit_attention(cands.causal_off_by_one, conventions=NAIVE, checks=["causality"], seed=3, max_examples=6,
                             budget="quick")
    assert first.to_dict()["results"] == second.to_dict()["results"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown check 'nope'"):
        audit_attention(scaled_dot_product_attention, checks=["nope"], budget="quick")
    with pytest.raises(ValueError, match="layout must be one of bhtd, bthd"):
        Conventions(layout="tbhd")  # type: ignore[arg-type]


def test_candidate_that_raises_gives_the_full_exception_counterexample_and_repro() -> None:
    def broken(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[-2] > 1:
            raise RuntimeError("kernel missing\nsecond line of the message")
        return F.scaled_dot_product_attention(q, k, v)

    report = audit_attention(broken, conventions=Conventions(supports_mask=False, supports_causal=False),
                             checks=["reference"], max_examples=10, dtypes=[torch.float64], budget="quick")
    result = report["reference"]
    assert result.status == "FAIL"
    assert "RuntimeError: kernel missing" in result.message
    assert result.traceback is not None
    assert "second line of the message" in result.traceback
    assert 'raise RuntimeError("kernel missing' in result.traceback
    assert result.counterexample is not None
    assert result.counterexample["t"] == 2  # shrunk to the smallest failing query length
    assert result.repro is not None
    assert "out = candidate(qc, kc, vc" in result.repro  # a plain call, as the audit made it
    assert result.traceback in report.table()


@pytest.mark.parametrize(
    ("candidate", "conventions", "message"),
    [
        (cands.plain_attention, Conventions(), "cannot be called as candidate(q, k, v, attn_mask=..., is_causal=...)"),
        (lambda q, k: q, Conventions(supports_mask=False, supports_causal=False),
         "cannot be called as candidate(q, k, v)"),
        (42, Conventions(), "is not callable"),
    ],
    ids=["no-mask-argument", "two-arguments", "not-callable"],
)
def test_wrong_signature_is_refused_before_the_search(candidate: Any, conventions: Conventions,
                                                      message: str) -> None:
    with pytest.raises(AuditUsageError) as info:
        audit_attention(candidate, conventions=conventions, name="cand", budget="quick")
    assert message in str(info.value)


@parametrize_audit(F.scaled_dot_product_attention, conventions=SDPA, max_examples=4)
def test_pytest_integration(audit_case: AuditCase) -> None:
    audit_case.run()


def test_parametrize_audit_gives_one_item_per_check() -> None:
    mark = parametrize_audit(F.scaled_dot_product_attention, conventions=SDPA)
    assert [p.id for p in mark.args[1]] == list(FUNCTION_CHECKS)


# ----------------------------------------------------------------------------------------------------
# Grouped-query attention told with enable_gqa=True (torch's SDPA)
# ----------------------------------------------------------------------------------------------------


def test_enable_gqa_is_passed_on_grouped_calls_only() -> None:
    seen: list[tuple[int, int, Any]] = []

    def recording(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:  # torch's SDPA, recording the call
        seen.append((q.shape[1], k.shape[1], kwargs.get("enable_gqa")))
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    report = audit_attention(recording, conventions=Conventions.torch_sdpa(gqa=True), checks=["reference"],
                             max_examples=20, dtypes=(torch.float64,), budget="quick")
    assert report.passed, report.table()
    assert {flag for h, g, flag in seen if h != g} == {True}  # every grouped call was told
    assert {flag for h, g, flag in seen if h == g} == {None}  # and no other call
    assert any(h != g for h, g, _ in seen)
    args, kwargs = candidate_call(Example(b=1, h=4, g=2, t=2, s=3, d=2, dv=2, seed=0, dtype="float32"),
                                  Conventions.torch_sdpa(gqa=True))
    assert kwargs == {"enable_gqa": True}
    q, k, v = args
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, **kwargs),
                       F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)))


def test_torch_sdpa_with_enable_gqa_passes_every_check() -> None:
    report = audit_attention(F.scaled_dot_product_attention, conventions=Conventions.torch_sdpa(gqa=True),
                             max_examples=8, budget="quick")
    assert report.passed, report.table()
    assert not any("grouped-query" in note for note in report.untested)


def test_grouped_heads_without_enable_gqa_fail_and_the_report_names_the_field() -> None:
    declared = Conventions(causal_alignment="top-left", fully_masked="any", mask_with_causal=False, supports_gqa=True)
    report = audit_attention(F.scaled_dot_product_attention, conventions=declared, checks=["reference"],
                             max_examples=10, dtypes=(torch.float64,), budget="quick")
    assert report.failed == ["reference"]
    assert report["reference"].message.startswith("candidate raised RuntimeError: The size of tensor a")
    assert any(line.startswith("  declared enable_gqa=False; behaves as True: h=4, g=2 raised RuntimeError: The size "
                               "of tensor a (4) must match the size of tensor b (2)") for line in report.contradictions)


def test_a_grouping_bug_behind_enable_gqa_fails_reference() -> None:
    conventions = dataclasses.replace(Conventions.torch_sdpa(gqa=True), fully_masked="zero")
    bad = audit_attention(cands.sdpa_gqa_tiled, conventions=conventions, checks=["reference", "masking"],
                          max_examples=20, budget="quick")
    assert bad.failed == ["reference", "masking"], bad.table()
    shape = bad["reference"].counterexample
    assert shape is not None
    assert shape["g"] < shape["h"]
    # the tiling is the other documented grouping: declared as such, it passes (the bug is the grouping)
    assert audit_attention(cands.sdpa_gqa_tiled, conventions=dataclasses.replace(conventions, grouping="r g"),
                           checks=["reference", "masking"], max_examples=20, budget="quick").passed
    assert audit_attention(cands.sdpa_gqa_right, conventions=conventions, checks=["reference", "masking"],
                           max_examples=20, budget="quick").passed


def test_enable_gqa_declarations_are_checked_before_any_example() -> None:
    with pytest.raises(ValueError, match=r"^Conventions: enable_gqa=True passes enable_gqa=True to calls with fewer "
                       r"key/value heads than query heads; declare supports_gqa=True too \(or "
                       r"Conventions.torch_sdpa\(gqa=True\)\)$"):
        Conventions(enable_gqa=True)
    with pytest.raises(AuditUsageError, match=r"cannot be called as candidate\(q, k, v, attn_mask=\.\.\., "
                       r"is_causal=\.\.\., enable_gqa=\.\.\.\): got an unexpected keyword argument 'enable_gqa' "
                       r"\(enable_gqa=True is passed because enable_gqa is declared\)$"):
        audit_attention(cands.naive_attention, conventions=Conventions(supports_gqa=True, enable_gqa=True),
                        budget="quick")


def test_takes_enable_gqa() -> None:
    assert takes_enable_gqa(F.scaled_dot_product_attention)  # a builtin: one call with the keyword
    assert takes_enable_gqa(cands.sdpa_gqa_right)  # its signature
    assert not takes_enable_gqa(cands.naive_attention)
    assert not takes_enable_gqa(torch.nn.functional.softmax)


# ----------------------------------------------------------------------------------------------------
# One block per root cause; the closing line per dtype
# ----------------------------------------------------------------------------------------------------


def test_one_block_for_a_root_cause_that_fails_every_check() -> None:
    report = audit_attention(cands.missing_scale, conventions=NAIVE, max_examples=6, budget="quick")
    table = report.table()
    assert table.endswith("\nfloat32: 1 passed, 11 failed; float64: 1 passed, 11 failed; 1 root cause")
    [cause] = report.causes
    assert cause.lines(1, 1)[:2] == [
        "root cause 1 of 1: the output differs from the reference with no mask and no causal flag",
        "  explains reference, scale, causality, batch_independence, permutation, masking, padding, fully_masked, "
        "mask_and_causal, large_logits, gradients [float32, float64]"]
    assert cause.shown.name == "reference"  # (its smallest counterexample of the two dtypes)
    assert table.count("counterexample {") == 1
    assert sum(line.startswith("out = candidate(") for line in table.splitlines()) == 1  # one repro


def test_failures_of_a_mask_bug_share_the_masking_block() -> None:
    report = audit_attention(cands.flipped_polarity, conventions=NAIVE, max_examples=6, budget="quick")
    assert [(c.check, c.explains()) for c in report.causes] == [
        ("masking", "masking, padding, mask_and_causal, large_logits, gradients [float32, float64]"),
        ("fully_masked", "fully_masked [float32, float64]")]
    assert report.causes[0].summary == ("the mask is applied wrongly (the output differs with the mask alone, no "
                                        "causal flag)")
    assert report.table().endswith("\nfloat32: 6 passed, 6 failed; float64: 6 passed, 6 failed; 2 root causes")


def test_a_causal_bug_is_its_own_block_and_a_passing_report_names_no_cause() -> None:
    report = audit_attention(cands.causal_off_by_one, conventions=NAIVE, max_examples=10, dtypes=(torch.float64,),
                             checks=["reference", "causality", "mask_and_causal", "gradients"], budget="quick")
    assert [(c.check, c.explains()) for c in report.causes] == [
        ("causality", "causality, mask_and_causal, gradients [float64]")]
    passing = audit_attention(F.scaled_dot_product_attention, conventions=SDPA, max_examples=3, budget="quick")
    assert passing.causes == []
    assert passing.table().endswith("\nfloat32: 10 passed; float64: 10 passed; 2 checks skipped")


def test_the_same_exception_everywhere_is_one_block() -> None:
    declared = Conventions(causal_alignment="top-left", fully_masked="any", mask_with_causal=False, supports_gqa=True)
    report = audit_attention(F.scaled_dot_product_attention, conventions=declared, max_examples=6,
                             checks=["reference", "causality", "masking", "gradients"], dtypes=(torch.float64,),
                             budget="quick")
    [cause] = report.causes
    assert cause.explains() == "reference, causality, masking, gradients [float64]"
    assert cause.summary.startswith("the candidate raises RuntimeError: The size of tensor a (")
    assert cause.shown.traceback is not None
    assert cause.shown.traceback in report.table()


def test_the_closing_line_opens_with_the_inferred_conventions_row() -> None:
    report = audit_attention(cands.bthd_attention, conventions="infer", max_examples=3, dtypes=(torch.float64,),
                             checks=["reference", "masking"], budget="quick")
    assert report.table().endswith("\nconventions PASS; float64: 2 passed")
    findings = audit_attention(cands.mask_ignored, conventions="infer", max_examples=3, dtypes=(torch.float64,),
                               checks=["reference"], budget="quick")
    assert findings.table().endswith("\nconventions FAIL (1 finding); float64: 1 passed")
