"""Convention inference: right on correct candidates of every convention (both values of each field), findings on
planted bugs no convention explains (and the audit under the inferred conventions FAILs with them), the evidence
is a runnable repro, and declared conventions contradicted by the behaviour are named with their witness."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.support import audit_candidates as cands
from tests.support.limits import HANG_SECONDS
from typed_transformer import scaled_dot_product_attention
from typed_transformer.audit import Conventions, audit_attention, candidate_call, infer_conventions
from typed_transformer.cli import main

OURS = dict(layout="bhtd", mask_polarity="keep", mask_kind="bool", causal_alignment="bottom-right", scale=None,
            fully_masked="zero", supports_mask=True, supports_causal=True, supports_gqa=True, grouping="g r",
            per_head_masks=True, mask_with_causal=True, decode_sees_all=False, always_causal=False)


@pytest.mark.parametrize(("candidate", "expected", "differences"), [
    (scaled_dot_product_attention, OURS, {}),
    (cands.naive_attention, dict(OURS, causal_alignment="top-left", fully_masked="nan", supports_gqa=False),
     {"causal_alignment": "top-left", "fully_masked": "nan"}),
    (cands.bthd_attention, dict(OURS, layout="bthd"), {}),
    (cands.drop_mask_attention, {"mask_polarity": "drop"}, {"mask_polarity": "drop"}),
    (cands.additive_only, {"mask_kind": "additive", "mask_polarity": "keep"}, {}),
    (cands.unit_scale_attention, {"scale": 1.0}, {"scale": 1.0, "causal_alignment": "top-left"}),
    (cands.plain_attention, {"supports_mask": False, "supports_causal": False, "always_causal": False}, {}),
    (cands.interleaved_groups, {"supports_gqa": True, "grouping": "r g"}, {"grouping": "r g"}),
    (cands.decode_sees_all, {"causal_alignment": "top-left", "decode_sees_all": True},
     {"causal_alignment": "top-left", "decode_sees_all": True}),
    (cands.always_causal, {"always_causal": True, "supports_causal": False, "causal_alignment": "top-left"},
     {"causal_alignment": "top-left", "fully_masked": "nan", "always_causal": True}),
    (F.scaled_dot_product_attention, {"causal_alignment": "top-left", "layout": "bhtd", "mask_polarity": "keep",
                                      "supports_gqa": True, "enable_gqa": True, "grouping": "g r"},
     {"causal_alignment": "top-left"}),
    (cands.sdpa_gqa_right, {"supports_gqa": True, "enable_gqa": True, "grouping": "g r"},
     {"causal_alignment": "top-left"}),
    (cands.sdpa_gqa_tiled, {"supports_gqa": True, "enable_gqa": True, "grouping": "r g"},
     {"causal_alignment": "top-left", "grouping": "r g"}),
], ids=lambda x: getattr(x, "__name__", "") if callable(x) else "")
def test_inference_on_correct_candidates(candidate: Callable[..., Tensor], expected: dict[str, Any],
                                         differences: dict[str, Any]) -> None:
    """Right conventions, no finding; every difference from the paper's attention is listed and keeps the audit
    from passing until it is declared (no check fails either way)."""
    inference = infer_conventions(candidate)
    assert inference.findings == []
    for name, value in expected.items():
        assert getattr(inference.conventions, name) == value, name
    assert {d.field: d.value for d in inference.differences} == differences
    report = audit_attention(candidate, conventions="infer", max_examples=8, budget="quick")
    assert report.failed == []
    assert report.undeclared == list(differences)
    assert report.passed == (not differences)
    if differences:
        assert audit_attention(candidate, conventions="infer", known=differences, max_examples=2,
                               dtypes=(torch.float64,), budget="quick").passed


def test_enable_gqa_is_inferred_with_its_evidence() -> None:
    inference = infer_conventions(F.scaled_dot_product_attention)
    assert inference.evidence["enable_gqa"].seen == (
        "h=4, g=2 raised RuntimeError: The size of tensor a (4) must match the size of tensor b (2) at non-singleton "
        "dimension 1 without enable_gqa=True, and matches the reference with it")
    assert "enable_gqa" not in infer_conventions(scaled_dot_product_attention).evidence  # takes g < h as it is


def test_fully_masked_nan_and_uniform() -> None:
    def uniform(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:  # a finite fill: a dead row averages the values
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if attn_mask is not None:
            logits = logits.masked_fill(~attn_mask, -1e30)
        out: Tensor = logits.softmax(-1) @ v
        return out

    assert infer_conventions(uniform).conventions.fully_masked == "uniform"
    assert infer_conventions(cands.nan_rows).conventions.fully_masked == "nan"
    assert infer_conventions(cands.finite_fill).conventions.fully_masked == "zero"  # (its bug is large_logits')


@pytest.mark.parametrize(("candidate", "field", "words"), [
    (cands.mask_ignored, "supports_mask", "accepted and ignored"),
    (cands.causal_ignored, "supports_causal", "accepted and ignored"),
    (cands.mask_multiplies_logits, "mask_polarity", "masks under no convention"),
    (cands.scale_by_heads, "scale", "depends on the head count"),
    (cands.causal_off_by_one, "causal_alignment", "matches neither top-left"),
    (cands.fully_masked_first_value, "fully_masked", "neither zeros, NaN nor the mean"),
    (cands.drops_mask_when_causal, "mask_with_causal", "only the causal mask applies"),
    (cands.first_head_mask, "per_head_masks", "not applied head by head"),
])
def test_planted_bugs_are_findings_and_fail_the_audit(candidate: Callable[..., Tensor], field: str,
                                                      words: str) -> None:
    inference = infer_conventions(candidate)
    assert field in [f.field for f in inference.findings]
    assert any(words in f.message for f in inference.findings if f.field == field)
    report = audit_attention(candidate, conventions="infer", max_examples=5, dtypes=(torch.float64,), budget="quick")
    assert report.status("conventions") == "FAIL"
    assert any(words in r.message for r in report.results if r.name == "conventions")
    assert words in report.table()


def test_evidence_is_a_runnable_repro() -> None:
    inference = infer_conventions(cands.naive_attention)
    evidence = inference.evidence["causal_alignment"]
    assert evidence.value == "top-left"
    assert evidence.example is not None
    assert (evidence.example.t, evidence.example.s) == (2, 4)
    namespace: dict[str, Any] = {"candidate": cands.naive_attention}
    exec(evidence.repro, namespace)  # the printed repro runs as printed
    args, kwargs = candidate_call(evidence.example, evidence.conventions or Conventions())
    assert torch.equal(namespace["out"], cands.naive_attention(*args, **kwargs))
    assert kwargs == {"is_causal": True}


def test_report_opens_with_the_inferred_conventions() -> None:
    report = audit_attention(cands.bthd_attention, conventions="infer", max_examples=3, dtypes=(torch.float64,),
                             budget="quick")
    lines = report.table().splitlines()
    assert lines[1].startswith("inferred conventions (")
    assert any(line.startswith("  layout = 'bthd': h=2, t=3, s=4") for line in lines[1:20])
    assert report.conventions["layout"] == "bthd"
    assert report.results[0].name == "conventions"
    assert report.results[0].status == "PASS"
    assert report.to_dict()["inferred"][0].startswith("inferred conventions")


def test_always_causal_is_audited_on_causal_examples_only() -> None:
    report = audit_attention(cands.always_causal, conventions="infer", max_examples=8, budget="quick")
    assert report.failed == [], report.table()
    assert report.undeclared == ["causal_alignment", "fully_masked", "always_causal"]  # nanoGPT's, not the paper's
    assert any("always_causal=True" in note for note in report.untested)
    # declared as an ordinary candidate, it fails reference and the report names always_causal
    declared = audit_attention(cands.always_causal, conventions=Conventions(supports_causal=False,
                                                                            causal_alignment="top-left"),
                               max_examples=8, dtypes=(torch.float64,), budget="quick")
    assert declared.status("reference") == "FAIL"
    assert "declared always_causal=False; behaves as True" in declared.table()


def test_declared_conventions_contradicted_are_named_with_the_witness() -> None:
    report = audit_attention(cands.naive_attention, conventions=Conventions(fully_masked="nan"), max_examples=10,
                             dtypes=(torch.float64,), budget="quick")
    assert report.status("causality") == "FAIL"
    text = report.table()
    assert ("declared causal_alignment='bottom-right'; behaves as 'top-left': is_causal=True, t=2, s=4: query i "
            "sees keys j <= i") in text
    assert "q = randn((1, 2, 2, 4), seed=" in text  # the witness, t=2 queries and s=4 keys, as a plain call
    assert "k = randn((1, 2, 4, 4), seed=" in text
    passing = audit_attention(cands.naive_attention, conventions=Conventions(
        causal_alignment="top-left", fully_masked="nan"), max_examples=5, dtypes=(torch.float64,), budget="quick")
    assert passing.passed
    assert passing.contradictions == []


def test_options_and_bad_arguments() -> None:
    inference = infer_conventions(cands.self_attention_only, self_attention=True, equal_head_sizes=True)
    assert inference.conventions.self_attention
    with pytest.raises(ValueError, match="head_count is not a field of Conventions"):
        infer_conventions(cands.naive_attention, head_count=2)
    with pytest.raises(ValueError, match="causal_alignment must be one of"):
        infer_conventions(cands.naive_attention, causal_alignment="diagonal")
    with pytest.raises(ValueError, match="known= goes with conventions='infer'"):
        audit_attention(cands.naive_attention, known={"layout": "bhtd"}, budget="quick")


# Narrowing: the fields a user knows, with conventions="infer"


def test_known_fields_agreeing_with_the_behaviour_are_confirmed() -> None:
    report = audit_attention(cands.naive_attention, conventions="infer", max_examples=5, dtypes=(torch.float64,),
                             known={"causal_alignment": "top-left", "layout": "bhtd"}, budget="quick")
    assert report.failed == [], report.table()
    assert report.undeclared == ["fully_masked"]  # NaN rows: not declared
    assert any(line.startswith("  causal_alignment = 'top-left': known (given), confirmed: is_causal=True")
               for line in report.inferred), report.inferred


def test_a_known_field_the_behaviour_contradicts_fails_with_its_witness() -> None:
    report = audit_attention(cands.naive_attention, conventions="infer", max_examples=5, dtypes=(torch.float64,),
                             known={"causal_alignment": "bottom-right"}, budget="quick")
    assert report.status("conventions") == "FAIL"
    row = next(r for r in report.results if r.name == "conventions" and r.status == "FAIL")
    assert row.message.startswith("causal_alignment: known causal_alignment='bottom-right'; behaves as 'top-left': "
                                  "is_causal=True, t=2, s=4: query i sees keys j <= i"), row.message
    assert row.repro is not None
    assert "q = randn((1, 2, 2, 4), seed=" in row.repro  # the witness, t=2 queries and s=4 keys, as a plain call
    assert "k = randn((1, 2, 4, 4), seed=" in row.repro
    # the other checks audit the behaviour (top-left), so only the contradiction fails
    assert [r.name for r in report.results if r.status == "FAIL"] == ["conventions"]


def test_known_fields_that_only_narrow_what_is_drawn() -> None:
    inference = infer_conventions(cands.naive_attention, fully_masked="any", supports_mask=False)
    assert inference.findings == []
    assert inference.conventions.fully_masked == "any"  # behaves as "nan": "any" is the looser declaration
    assert "narrows what is drawn; behaves as 'nan'" in inference.evidence["fully_masked"].seen
    report = audit_attention(cands.naive_attention, conventions="infer", max_examples=4, dtypes=(torch.float64,),
                             known={"supports_mask": False}, budget="quick")
    assert report.failed == []
    assert report.undeclared == ["causal_alignment", "fully_masked"]
    assert report.status("masking") == "SKIP"


def test_known_fields_with_a_planted_bug_and_constraints() -> None:
    # a causal mask off by one matches no alignment: knowing the alignment does not explain the bug away
    report = audit_attention(cands.causal_off_by_one, conventions="infer", max_examples=5, dtypes=(torch.float64,),
                             known={"causal_alignment": "top-left"}, budget="quick")
    assert report.status("conventions") == "FAIL"
    assert not report.passed
    # constraints ride along with known fields
    inference = infer_conventions(cands.self_attention_only, self_attention=True, equal_head_sizes=True,
                                  layout="bthd")
    assert inference.conventions.self_attention
    assert inference.conventions.layout == "bthd"
    assert inference.evidence["layout"].value == "bthd"


def test_known_fields_of_a_module() -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.llama.modeling_llama import LlamaAttention

    from typed_transformer.audit import audit_module, hf_build, hf_spec
    from typed_transformer.strategies import randomize_parameters

    module = randomize_parameters(hf_build(LlamaAttention), 0)
    report = audit_module(module, hf_spec(module), conventions="infer", checks=["reference"], max_examples=3,
                          dtypes=(torch.float32,), known={"causal_alignment": "bottom-right", "fully_masked": "zero"},
                          budget="quick")
    failing = [r.message for r in report.results if r.name == "conventions" and r.status == "FAIL"]
    assert len(failing) == 1
    assert failing[0].startswith("fully_masked: known fully_masked='zero'; behaves as 'any'"), failing
    assert any("causal_alignment = 'bottom-right': known (given), confirmed" in line for line in report.inferred)



def refuses_mask_with_causal(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                             is_causal: bool = False) -> Tensor:
    """Correct, and raises on a mask with is_causal=True (torch's SDPA did before 2.1)."""
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal cannot both be set")
    out: Tensor = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return out


def test_mask_with_causal_is_false_only_when_the_combination_raises() -> None:
    inference = infer_conventions(refuses_mask_with_causal)
    assert inference.findings == []
    assert inference.conventions.mask_with_causal is False
    assert "raised ValueError: attn_mask and is_causal cannot both be set" in (
        inference.evidence["mask_with_causal"].seen)
    report = audit_attention(refuses_mask_with_causal, conventions="infer", max_examples=5, dtypes=(torch.float64,),
                             budget="quick")
    assert report.passed, report.table()
    assert any("mask_with_causal=False" in note for note in report.untested)
    assert infer_conventions(scaled_dot_product_attention).conventions.mask_with_causal is True


def test_fully_masked_rows_that_differ_by_dtype_or_between_calls() -> None:
    def nan_in_float32_only(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:  # documented: "any", with both witnesses
        out = cands.naive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return out if q.dtype == torch.float32 else out.nan_to_num(0.0)

    calls = iter(range(10**6))

    def nan_every_other_call(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                             is_causal: bool = False) -> Tensor:  # no convention: a finding
        out = cands.naive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return out.nan_to_num(0.0) if next(calls) % 2 else out

    mixed = infer_conventions(nan_in_float32_only)
    assert mixed.findings == []
    assert mixed.conventions.fully_masked == "any"
    assert "NaN with dv = d in float32" in mixed.evidence["fully_masked"].seen
    assert "zeros with dv = d in float64" in mixed.evidence["fully_masked"].seen
    flaky = infer_conventions(nan_every_other_call)
    assert [f.field for f in flaky.findings] == ["fully_masked"]
    assert "gives NaN on one call and not on the next" in flaky.findings[0].message


def test_docs_audit_opens_with_infer_and_its_block_is_current() -> None:
    """docs/audit.md starts with an audit with inferred conventions: its first example uses conventions="infer",
    no table (a conventions table) comes before it, and the block is what benchmarks/audit_infer_docs.py writes
    today (timings and ratios aside, which vary by CPU: its --check exits 1 on a stale block)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    page = (root / "docs" / "audit.md").read_text(encoding="utf-8")
    first = page.index("```python")
    assert "--infer" in page[:first]
    assert not [line for line in page[:first].splitlines() if line.startswith("|")]
    assert 'conventions="infer"' in page[first:page.index("```", first + 3)]
    check = subprocess.run([sys.executable, str(root / "benchmarks" / "audit_infer_docs.py"), "--check"],
                           capture_output=True, text=True, timeout=HANG_SECONDS)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_grouping_other_than_torchs_is_an_undeclared_difference_declarable_by_api_and_cli(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Query head i on key/value head i % g (``h = (r g)``) where torch's enable_gqa and HF's repeat_kv use
    i // (h/g): correct attention, but not the one a port of those computes (issue 42)."""
    report = audit_attention(cands.interleaved_groups, conventions="infer", max_examples=4, budget="quick",
                             dtypes=(torch.float64,))
    assert report.failed == []
    assert report.undeclared == ["grouping"]
    assert not report.passed
    line = next(d.line() for d in report.differences if d.field == "grouping")
    assert "i // (h/g), as torch's enable_gqa and Hugging Face's repeat_kv" in line
    assert "--expect grouping='r g'" in line  # quoted for the shell
    assert audit_attention(cands.interleaved_groups, conventions="infer", known={"grouping": "r g"}, max_examples=4,
                           budget="quick", dtypes=(torch.float64,)).passed
    argv = ["audit", "tests.support.audit_candidates:interleaved_groups", "--infer", "--budget", "quick", "--dtypes",
            "float64", "--max-examples", "4"]
    assert main(argv) == 3
    assert "grouping = 'r g'" in capsys.readouterr().out
    assert main([*argv, "--expect", "grouping=r g"]) == 0
