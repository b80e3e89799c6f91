"""Kernels audited where they run (issue 42): a half-only kernel and one that needs dv = d are inferred and audited
with zero configuration, each refusal listed under "not tested" with the probe that decided it; torch's own CPU
flash backend passes but for its top-left causal alignment (an undeclared difference)."""

import math
import warnings

import pytest
import torch
from torch import Tensor

from tests.support import kernels
from typed_transformer.audit import audit_attention, infer_conventions
from typed_transformer.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch's "Flash attention kernel not used because"


def test_the_cpu_flash_backend_passes_at_zero_configuration_but_for_its_top_left_alignment() -> None:
    """Before: the scale probe's dv = 4 with d = 2 was refused ("No available kernel"), inference stopped, every
    check FAILed as "candidate raised" and gradients FAILed at 1.5e4 under the default bottom-right alignment."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_attention(kernels.sdpa_flash, conventions="infer", seed=0, max_examples=6, budget="ci")
    assert report.failed == [], report.table()
    assert report.undeclared == ["causal_alignment"]
    assert not report.passed  # exit status 3 on the command line, until declared
    assert "dv != d (equal_head_sizes=True)" in report.untested
    inferred = "\n".join(report.inferred)
    assert "equal_head_sizes = True: h=1, t=3, s=4, d=4: dv=3 raised RuntimeError: No available kernel." in inferred
    declared = audit_attention(kernels.sdpa_flash, conventions="infer", known={"causal_alignment": "top-left"},
                               seed=0, max_examples=4, budget="quick", dtypes=[torch.float32])
    assert declared.passed, declared.table()


def test_a_half_only_kernel_is_inferred_and_audited_in_its_own_dtypes() -> None:
    inference = infer_conventions(kernels.half_only)
    assert inference.findings == []
    assert inference.evidence["probe_dtype"].value == "float16"
    assert "float64 with dv=3 raised TypeError: only float16 and bfloat16" in inference.evidence["probe_dtype"].seen
    assert inference.conventions.scale is None  # 1/sqrt(d), estimated from float16 outputs
    assert inference.conventions.causal_alignment == "bottom-right"
    report = audit_attention(kernels.half_only, conventions="infer", seed=0, max_examples=6, budget="ci")
    assert report.dtypes == ["float16", "bfloat16"]
    assert report.passed, report.table()
    assert any(note.startswith("float32 (the candidate refused it: only float16") for note in report.untested)
    assert any(note.startswith("float64 (the candidate refused it: only float16") for note in report.untested)


def test_a_half_only_kernels_planted_causal_bug_is_caught() -> None:
    report = audit_attention(kernels.half_only_causal_off_by_one, conventions="infer", seed=0, max_examples=6,
                             budget="ci")
    assert report.status("conventions") == "FAIL"
    assert "causal_alignment: is_causal=True at t=s=3 matches neither" in report["conventions"].message
    rows = {(r.name, r.dtype): r.status for r in report.results}
    assert rows["causality", "float16"] == rows["causality", "bfloat16"] == "FAIL"
    assert rows["reference", "float16"] == rows["masking", "bfloat16"] == "PASS"  # the bug is causal only


def _half_only_unit_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                          is_causal: bool = False) -> Tensor:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError("half only")
    return kernels.no_scale(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def test_a_constant_scale_estimated_in_half_precision_is_snapped_to_the_exact_constant() -> None:
    inference = infer_conventions(_half_only_unit_scale)
    assert inference.conventions.scale == 1.0
    assert [d.field for d in inference.differences] == ["scale"]
    assert math.isclose(inference.conventions.scale, 1.0, rel_tol=0, abs_tol=0)


def _refuses_everything(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    raise NotImplementedError("not built for this machine")


def test_a_candidate_that_refuses_every_dtype_is_one_finding() -> None:
    inference = infer_conventions(_refuses_everything)
    assert [f.field for f in inference.findings] == ["reference"]
    message = inference.findings[0].message
    assert "refused in every dtype" in message
    assert "bfloat16 with dv=4 raised NotImplementedError: not built for this machine" in message


def test_the_command_line_audits_the_half_only_kernel_in_float16_and_bfloat16(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:half_only", "--infer", "--budget", "quick", "--checks",
                 "reference,causality"]) == 0
    out = capsys.readouterr().out
    assert "dtypes float16, bfloat16" in out.splitlines()[0]
    assert "probe_dtype = 'float16'" in out
