"""Inference never explains a bug away: differences from the paper's attention are listed first and keep the audit
from passing until declared (``known=`` / ``--expect``, exit status 3 otherwise); both mask kinds are probed; a
scale of 1/sqrt(s) is named; repros are plain calls that print the difference they name (run in a fresh
interpreter), gradients repros print the gradient difference. The planted kernels are in tests/support/kernels.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import kernels
from tests.support.limits import HANG_SECONDS
from typed_transformer.audit import AuditReport, audit_attention
from typed_transformer.audit.core.causes import input_size
from typed_transformer.cli import UNDECLARED_DIFFERENCES, main

ROOT = Path(__file__).resolve().parents[3]
QUICK = {"budget": "quick", "max_examples": 4, "dtypes": (torch.float64,)}


def _infer(kernel: object, **known: object) -> AuditReport:
    return audit_attention(kernel, conventions="infer", known=known or None, **QUICK)  # type: ignore[arg-type]


def _finding(report: AuditReport) -> str:
    rows = [r.message for r in report.results if r.name == "conventions" and r.status == "FAIL"]
    assert len(rows) == 1, report.table()
    return rows[0]


def _run(snippet: str) -> str:
    """Run ``snippet`` in a fresh interpreter at the repository root; what it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=HANG_SECONDS, check=False)
    assert done.returncode == 0, f"{snippet}\n---\n{done.stderr}"
    return done.stdout


def _max_error(printed: str) -> float:
    found = re.search(r"^max error (\S+)$", printed, flags=re.MULTILINE)
    assert found is not None, printed
    return float(found.group(1))


def test_a_missing_scale_is_an_undeclared_difference_that_says_what_to_declare() -> None:
    report = _infer(kernels.no_scale)
    assert report.failed == []  # every check passes under scale = 1 ...
    assert report.undeclared == ["scale"]
    assert not report.passed
    text = report.table()
    first = text.splitlines()[1:3]
    assert first[0].startswith("differences from the paper's attention (1, 1 not declared")
    assert "scale = 1.0 (the paper: 1/sqrt(d), d the head size)" in first[1]
    assert "NOT DECLARED: if intended, declare known={'scale': 1.0} (command line: --expect scale=1)" in first[1]
    assert text.endswith("not passed: undeclared difference from the paper's attention (scale)")
    declared = _infer(kernels.no_scale, scale=1.0)
    assert declared.passed
    assert declared.undeclared == []
    assert declared.differences[0].declared


def test_a_key_length_scale_is_named_so() -> None:
    report = _infer(kernels.key_length_scale)
    message = _finding(report)
    assert message.startswith("scale: the scale depends on the key length: logit scale 0.5 at s=4 and 0.378 at s=7")
    assert "1/sqrt(s), the key length where the paper has the head size d" in message
    assert "0.707" not in message
    assert "layout" not in message


def test_a_boolean_mask_added_as_numbers_is_a_finding_not_additive() -> None:
    report = _infer(kernels.bool_mask_added)
    assert _finding(report).startswith("mask_kind: a boolean mask (1, 1, 3, 4) is added to the logits as +1/+0 "
                                       "(True -> +1), masking nothing, while a float 0/-inf mask is applied")
    assert not report.passed


def test_a_flipped_boolean_path_is_a_finding_unless_declared() -> None:
    report = _infer(kernels.flipped_bool_mask)
    assert _finding(report).startswith("mask_polarity: the boolean path is flipped against the float one")
    assert "--expect mask_polarity=drop" in _finding(report)
    declared = _infer(kernels.flipped_bool_mask, mask_polarity="drop")  # nn.MultiheadAttention's, if intended
    assert declared.passed, declared.table()


def test_a_correct_kernel_taking_both_mask_kinds_passes() -> None:
    report = _infer(kernels.paper_kernel)
    assert report.passed
    assert report.differences == []
    assert any("(a float 0/-inf mask is applied too)" in line for line in report.inferred)


def test_a_dropped_key_is_not_blamed_on_the_causal_alignment() -> None:
    report = _infer(kernels.drops_last_key_when_odd)
    message = _finding(report)
    assert message.startswith("reference: the last query against s=7 keys")
    assert "causal_alignment" not in report.table()
    assert report.causes[0].summary == "the output differs from the reference with no mask and no causal flag"
    shown = report.causes[0].shown
    assert shown.counterexample is not None
    assert shown.counterexample["s"] % 2 == 1
    assert all(input_size(shown) <= input_size(row) for row in report.causes[0].rows if row.name == shown.name)


@pytest.mark.parametrize(("kernel", "extra", "status", "words"), [
    ("no_scale", [], UNDECLARED_DIFFERENCES, "--expect scale=1"),
    ("no_scale", ["--expect", "scale=1"], 0, "scale = 1.0 (the paper: 1/sqrt(d), d the head size): logit scale 1"),
    ("key_length_scale", [], 1, "the scale depends on the key length"),
    ("bool_mask_added", [], 1, "is added to the logits as +1/+0"),
    ("flipped_bool_mask", [], 1, "the boolean path is flipped"),
    ("flipped_bool_mask", ["--expect", "mask_polarity=drop"], 0, "mask_polarity = 'drop'"),
    ("paper_kernel", [], 0, "conventions PASS"),
])
def test_the_command_line_catches_the_planted_kernels(kernel: str, extra: list[str], status: int, words: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", f"tests.support.kernels:{kernel}", "--infer", "--max-examples", "3", "--dtypes", "float64",
                 "--budget", "quick", *extra])
    out = capsys.readouterr().out
    assert code == status, out
    assert words in out


def test_expect_needs_infer_and_a_known_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:no_scale", "--expect", "scale=1"]) == 2
    assert "--expect goes with --infer" in capsys.readouterr().err
    assert main(["audit", "tests.support.kernels:no_scale", "--infer", "--expect", "colour=red"]) == 2
    assert "--expect: give NAME=VALUE with NAME among layout" in capsys.readouterr().err


def test_a_findings_repro_is_a_plain_call_that_prints_the_difference() -> None:
    report = _infer(kernels.bool_mask_added)
    repro = report["conventions"].repro
    assert repro is not None
    assert "adapter" not in repro
    assert "Example(" not in repro
    assert "out = candidate(qc, kc, vc, attn_mask=keep)" in repro
    assert "ref = scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=False)" in repro
    assert _max_error(_run(repro)) > 1e-2


def test_a_gradients_repro_prints_the_gradient_difference() -> None:
    report = audit_attention(kernels.half_value_gradient, checks=["gradients"], **QUICK)  # type: ignore[arg-type]
    repro = report["gradients"].repro
    assert repro is not None
    assert report["gradients"].status == "FAIL"
    printed = _run(repro)
    errors = re.search(r"^gradient errors \{'q': (\S+), 'k': (\S+), 'v': (\S+)\}$", printed, flags=re.MULTILINE)
    assert errors is not None, printed
    dq, dk, dv = (float(x) for x in errors.groups())
    assert dq < 1e-12
    assert dk < 1e-12
    assert dv > 1e-2
    assert _max_error(printed) == dv


def test_a_module_grouped_by_repeat_is_diagnosed_as_the_other_grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama's key/value heads repeated with ``.repeat`` where it means ``repeat_interleave``: the module matches
    the reference under the other documented grouping, and its root cause says which."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    from transformers.models.llama import modeling_llama

    from typed_transformer.audit import audit_module

    def repeat(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
        return hidden.repeat(1, n_rep, 1, 1)  # head i uses kv head i % g

    monkeypatch.setattr(modeling_llama, "repeat_kv", repeat)
    config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2)
    module = modeling_llama.LlamaAttention(config, layer_idx=0)
    report = audit_module(module, "llama", checks=["reference"], dtypes=[torch.float32], max_examples=3, budget="quick")
    assert report.failed == ["reference"]
    assert report.causes[0].diagnosis == (
        "the module matches the reference when its key/value heads are grouped 'r g' (head i uses kv head i % g: "
        ".repeat) where the spec says 'g r' (head i uses kv head i // r: repeat_interleave): declare grouping='r g' "
        "in the spec if intended")
