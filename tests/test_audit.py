"""The audit toolkit: planted bugs fail the right check, correct candidates in every convention pass."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests import _audit_candidates as cands
from typed_transformer import scaled_dot_product_attention
from typed_transformer.audit import (
    CHECKS,
    MHA_CHECKS,
    AuditCase,
    Conventions,
    Example,
    audit_attention,
    audit_multihead,
    candidate_call,
    parametrize_audit,
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
    report = audit_attention(candidate, conventions=conventions, checks=[check], max_examples=6)
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
    assert "candidate_call(example" in result.repro


def test_planted_bugs_fail_every_affected_check_in_a_full_audit() -> None:
    report = audit_attention(cands.causal_off_by_one, conventions=NAIVE, max_examples=6)
    assert report.failed == ["causality"]
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
    (cands.unit_scale_attention, Conventions(causal_alignment="top-left", scale=1.0, fully_masked="any"), 0),
]


@pytest.mark.parametrize(("candidate", "conventions", "seed"), CORRECT,
                         ids=["ours-0", "ours-1", "ours-2", "sdpa-0", "sdpa-1", "sdpa-2", "naive", "bthd", "drop",
                              "unit-scale"])
def test_correct_candidates_pass(candidate: Callable[..., Tensor], conventions: Conventions, seed: int) -> None:
    report = audit_attention(candidate, conventions=conventions, seed=seed, max_examples=6)
    assert report.passed, report.table()
    expected_skips = {"fully_masked"} if conventions.fully_masked == "any" else set()
    assert {r.name for r in report.results if r.status == "SKIP"} == expected_skips
    assert [r.name for r in report.results] == list(CHECKS)


def test_unsupported_features_are_skipped() -> None:
    conventions = Conventions(supports_mask=False, supports_causal=False, supports_autograd=True)
    report = audit_attention(cands.plain_attention, conventions=conventions, max_examples=6)
    assert report.passed, report.table()
    skipped = {r.name for r in report.results if r.status == "SKIP"}
    assert skipped == {"causality", "masking", "padding", "fully_masked"}


def test_wrong_conventions_fail() -> None:
    # SDPA is top-left: declaring bottom-right must make the causality check fail.
    report = audit_attention(F.scaled_dot_product_attention, checks=["causality"],
                             conventions=Conventions(fully_masked="any"), max_examples=6)
    assert report.failed == ["causality"]
    # Our function with torch's polarity declared: the masking check fails.
    report = audit_attention(scaled_dot_product_attention, checks=["masking"],
                             conventions=Conventions(mask_polarity="drop"), max_examples=6)
    assert report.failed == ["masking"]


def test_no_false_alarms_over_many_seeds() -> None:
    for seed in range(4):
        report = audit_attention(F.scaled_dot_product_attention, conventions=SDPA, seed=seed, max_examples=10,
                                 checks=["reference", "scale", "gradients"])
        assert report.passed, report.table()


def test_report_table_and_json(tmp_path: Path) -> None:
    report = audit_attention(cands.missing_scale, conventions=NAIVE, checks=["scale", "dtype"], max_examples=6)
    table = report.table()
    assert table.splitlines()[1].split() == ["check", "status", "ratio", "detail"]
    assert [line.split()[:2] for line in table.splitlines()[3:5]] == [["scale", "FAIL"], ["dtype", "PASS"]]
    assert "1 passed, 1 failed, 0 skipped" in table
    assert str(report) == table
    path = tmp_path / "audit.json"
    text = report.to_json(str(path))
    data = json.loads(path.read_text())
    assert data == json.loads(text)
    assert data["passed"] is False
    assert [r["status"] for r in data["results"]] == ["FAIL", "PASS"]
    assert data["results"][0]["ratio"] > 100
    assert data["results"][0]["counterexample"]["d"] >= 16
    assert data["conventions"]["causal_alignment"] == "top-left"


def test_audit_is_reproducible_for_a_seed() -> None:
    first = audit_attention(cands.causal_off_by_one, conventions=NAIVE, checks=["causality"], seed=3, max_examples=6)
    second = audit_attention(cands.causal_off_by_one, conventions=NAIVE, checks=["causality"], seed=3, max_examples=6)
    assert first.to_dict()["results"] == second.to_dict()["results"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown check 'nope'"):
        audit_attention(scaled_dot_product_attention, checks=["nope"])
    with pytest.raises(ValueError, match="layout must be one of bhtd, bthd"):
        Conventions(layout="tbhd")  # type: ignore[arg-type]


def test_candidate_that_raises_fails_with_the_error() -> None:
    def broken(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        raise RuntimeError("kernel missing")

    report = audit_attention(broken, conventions=Conventions(supports_mask=False), checks=["reference"], max_examples=6)
    assert report.failed == ["reference"]
    assert "RuntimeError: kernel missing" in report["reference"].message


def test_audit_multihead_passes_torch_mha() -> None:
    report = audit_multihead(torch.nn.MultiheadAttention(8, 2, batch_first=True), max_examples=5)
    assert report.passed, report.table()
    assert [r.name for r in report.results] == list(MHA_CHECKS)


def test_audit_multihead_with_a_factory_and_sequence_first() -> None:
    report = audit_multihead(lambda: torch.nn.MultiheadAttention(6, 3, kdim=4, vdim=5, bias=False), max_examples=4)
    assert report.passed, report.table()


@parametrize_audit(F.scaled_dot_product_attention, conventions=SDPA, max_examples=4)
def test_pytest_integration(audit_case: AuditCase) -> None:
    audit_case.run()


def test_parametrize_audit_gives_one_item_per_check() -> None:
    mark = parametrize_audit(F.scaled_dot_product_attention, conventions=SDPA)
    assert [p.id for p in mark.args[1]] == list(CHECKS)


class IgnoresAttnMask(torch.nn.MultiheadAttention):
    """Planted bug: drops attn_mask (so causal masking too), keeps key padding."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        kwargs["attn_mask"] = None
        return super().forward(query, key, value, *args, **kwargs)


class DetachesValue(torch.nn.MultiheadAttention):
    """Planted bug: the right output, but no gradient flows into value."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any) -> Any:
        return super().forward(query, key, value.detach(), *args, **kwargs)


@pytest.mark.parametrize(("module", "failing"), [(IgnoresAttnMask, {"causality", "masking"}),
                                                  (DetachesValue, {"gradients"})])
def test_audit_multihead_fails_planted_bugs_in_their_checks(module: type[torch.nn.MultiheadAttention],
                                                            failing: set[str]) -> None:
    torch.manual_seed(0)
    report = audit_multihead(module(8, 2, batch_first=True), max_examples=8)
    assert {r.name for r in report.results if r.status == "FAIL"} == failing, report.table()
    assert {r.name for r in report.results if r.status == "PASS"} == set(MHA_CHECKS) - failing


def test_audit_multihead_leaves_the_candidates_gradients_alone() -> None:
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    report = audit_multihead(module, checks=["gradients"], max_examples=3)
    assert report.passed, report.table()
    assert all(p.grad is None for p in module.parameters())
