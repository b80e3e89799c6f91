"""The default audit reaches the sizes and dtypes kernels get wrong (issue 30): the kernel gallery's planted bugs
are caught with inferred conventions and shrunk to the smallest failing size, the correct tiled kernel passes,
``budget="quick"`` keeps the small sizes (and misses them), half precision is judged as a float32-accumulating
kernel would be."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tests.support import kernels
from tests.support.audit_candidates import no_max_subtraction
from tests.support.limits import HANG_SECONDS
from typed_transformer import from_torch, scaled_dot_product_attention
from typed_transformer.audit import BUDGETS, Budget, Conventions, audit_attention, audit_module
from typed_transformer.audit.core.running import resolve_budget
from typed_transformer.cli import main
from typed_transformer.strategies import randomize_parameters

F32 = [torch.float32]
ROOT = Path(__file__).resolve().parents[3]


def failing(kernel: object, check: str, **options: object) -> dict[str, Any]:
    """The counterexample of ``check`` on ``kernel`` audited with inferred conventions (the check must fail)."""
    report = audit_attention(kernel, conventions="infer", seed=0, checks=[check], **options)  # type: ignore[arg-type]
    assert report.status(check) == "FAIL", report.table()
    counterexample = report[check].counterexample
    assert counterexample is not None
    return counterexample


@pytest.mark.parametrize(("kernel", "check", "size", "shrunk"), [
    (kernels.tiled_16_no_rescale, "reference", "s", 17),
    # Hypothesis alone stopped at 127: at 65 keys its shrunk seed's rows pass; the search below 127 finds 65
    (kernels.tiled_64_no_rescale, "reference", "s", 65),
    (kernels.batch_chunks, "masking", "b", 5),
])
def test_a_planted_kernel_is_caught_and_shrunk_to_the_smallest_failing_size(
        kernel: object, check: str, size: str, shrunk: int) -> None:
    assert failing(kernel, check, dtypes=F32)[size] == shrunk
    quick = audit_attention(kernel, conventions="infer", seed=0, checks=[check], dtypes=F32,  # type: ignore[arg-type]
                            budget="quick")
    assert quick.passed, quick.table()  # the small sizes never reach the bug
    assert "sizes past 6 keys and 8 features, batches past 3 (budget='quick')" in quick.untested


def test_causal_block_skipping_is_caught_past_32_keys() -> None:
    example = failing(kernels.causal_block_skip, "causality", dtypes=F32)
    assert example["is_causal"] is True
    assert example["s"] > 32
    assert audit_attention(kernels.causal_block_skip, conventions="infer", seed=0, checks=["causality"], dtypes=F32,
                           budget="quick").passed


def test_the_fp16_overflow_kernel_fails_in_float16_by_default_and_passes_in_float32() -> None:
    report = audit_attention(kernels.fp16_overflow, conventions="infer", seed=0, checks=["large_logits"])
    assert report.dtypes == ["float32", "float64", "float16", "bfloat16"]
    rows = {r.dtype: r for r in report.results}
    assert rows["float32"].status == "PASS"
    assert rows["float64"].status == "PASS"
    assert rows["float16"].status == "FAIL", report.table()
    assert "logits scaled to 100000" in rows["float16"].message


def test_a_half_precision_accumulator_fails_past_the_small_sizes_and_float32_sums_pass() -> None:
    report = audit_attention(kernels.half_accumulator, conventions="infer", seed=0, checks=["reference"],
                             dtypes=[torch.float32, torch.float16, torch.bfloat16])
    rows = {r.dtype: r for r in report.results}
    assert rows["float32"].status == "PASS"
    for dtype in ("float16", "bfloat16"):
        assert rows[dtype].status == "FAIL", report.table()
        counterexample = rows[dtype].counterexample
        assert counterexample is not None
        assert counterexample["s"] >= 15  # a deep length: the small sizes (up to 6 keys) stay within the bound
    quick = audit_attention(kernels.half_accumulator, conventions="infer", seed=0, checks=["reference"],
                            dtypes=[torch.float16, torch.bfloat16], budget="quick")
    assert quick.passed, quick.table()
    # the same loop with float32 sums (the tiled kernel, blocks of 16 keys) passes in half precision
    tiled = audit_attention(kernels.tiled_attention, conventions="infer", seed=0, checks=["reference"],
                            dtypes=[torch.float16, torch.bfloat16])
    assert tiled.passed, tiled.table()


def test_a_deep_counterexample_repro_prints_the_error_the_report_names(tmp_path: Path) -> None:
    """The repro builds the deep example's keys as the audit did (growing along the row: Example.ramp)."""
    result = audit_attention(kernels.tiled_16_no_rescale, conventions="infer", seed=0, checks=["reference"],
                             dtypes=F32)["reference"]
    assert result.repro is not None
    assert "torch.arange(17" in result.repro
    done = subprocess.run([sys.executable, "-c", result.repro], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    printed = float(done.stdout.split("max error ", 1)[1].split()[0])
    named = float(result.message.split("max error ", 1)[1].split()[0])
    assert f"{printed:.3g}" == f"{named:.3g}", (done.stdout, result.message)


def test_one_bug_is_one_root_cause_in_every_dtype_shown_on_its_smallest_input() -> None:
    """Half-precision rows are replayed under the rule that judged them (the float32-accumulating kernel's
    bound), so that they join the float64 rows' cause instead of each check making its own block."""
    report = audit_attention(kernels.tiled_16_no_rescale, conventions="infer", seed=0,
                             checks=["reference", "batch_independence", "padding", "large_logits"],
                             dtypes=[torch.float64, torch.float16])
    assert len(report.failed) == 4, report.table()
    assert len(report.causes) == 1, report.table()
    cause = report.causes[0]
    assert cause.check == "reference"
    assert {(r.name, r.dtype) for r in cause.rows} == {(c, d) for c in report.failed for d in ("float64", "float16")}
    assert cause.shown.counterexample is not None
    assert cause.shown.counterexample["s"] == 17


def test_a_softmax_without_the_max_subtracted_fails_in_float16() -> None:
    report = audit_attention(no_max_subtraction, conventions="infer", seed=0, checks=["large_logits"],
                             dtypes=[torch.float16], budget="quick")
    assert report.status("large_logits") == "FAIL", report.table()


def test_the_correct_tiled_kernel_passes_the_default_audit_in_every_dtype() -> None:
    report = audit_attention(kernels.tiled_attention, conventions="infer", seed=0, max_examples=5)
    assert report.passed, report.table()
    assert report.dtypes == ["float32", "float64", "float16", "bfloat16"]
    assert all(r.examples > 5 for r in report.results if r.status == "PASS" and r.name != "conventions")


@pytest.mark.parametrize(("candidate", "conventions"), [(scaled_dot_product_attention, "infer"),
                                                         (F.scaled_dot_product_attention, Conventions.torch_sdpa())],
                         ids=["ours-inferred", "torch-sdpa"])
def test_the_correct_functions_pass_the_default_audit_in_every_dtype(candidate: object, conventions: object) -> None:
    report = audit_attention(candidate, conventions=conventions, seed=0, max_examples=3)  # type: ignore[arg-type]
    assert report.passed, report.table()
    assert report.dtypes == ["float32", "float64", "float16", "bfloat16"]


def test_nn_multihead_attention_converted_by_from_torch_passes_the_default_audit() -> None:
    mha = randomize_parameters(nn.MultiheadAttention(16, 4, batch_first=True), seed=0)
    report = audit_module(from_torch(mha), "typed_transformer", seed=0, max_examples=3)
    assert report.passed, report.table()
    assert all(r.examples > 3 for r in report.results if r.status == "PASS" and r.name != "fast_path")


def _refuses_half(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
    if q.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"{q.dtype} is not supported")
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def test_a_candidate_that_refuses_half_precision_is_reported_as_skipping_it() -> None:
    report = audit_attention(_refuses_half, seed=0, checks=["reference"], budget=Budget(deep_examples=0))
    assert report.passed, report.table()
    assert report.dtypes == ["float32", "float64"]
    assert "float16 (the candidate refused it: torch.float16 is not supported)" in report.untested
    assert "bfloat16 (the candidate refused it: torch.bfloat16 is not supported)" in report.untested
    explicit = audit_attention(_refuses_half, seed=0, checks=["reference"], dtypes=[torch.float16], budget="quick")
    assert explicit.status("reference") == "FAIL"  # asked for by name: a refusal is a failure


def test_the_half_precision_bound_does_not_grow_with_the_logits() -> None:
    """A float16 kernel whose logits overflow gives a finite, wrong row: under the old rule (2 ulp x max|ref| x the
    logit amplification x (s + d)) any finite output passed at logits of 1e5."""
    q = torch.full((1, 1, 1, 4), 160.0, dtype=torch.float64)
    k = torch.full((1, 1, 2, 4), 160.0, dtype=torch.float64)
    v = torch.tensor([[[[1.0], [-1.0]]]], dtype=torch.float64)
    out = kernels.fp16_overflow(q.half(), k.half(), v.half())
    assert float(out.abs().max()) == 0.0  # the overflowed row, zeroed
    report = audit_attention(kernels.fp16_overflow, seed=0, checks=["large_logits"], dtypes=[torch.float16],
                             budget="quick")
    message = report["large_logits"].message
    allowed = float(message.split("allowed ")[1].split()[0])
    assert allowed < 0.01, message  # the old rule allowed any finite output here


def test_budgets() -> None:
    assert resolve_budget("quick") is BUDGETS["quick"]
    assert BUDGETS["quick"].deep_examples == 0
    assert resolve_budget(Budget(lengths=(40,))).lengths == (40,)
    with pytest.raises(ValueError, match="unknown budget 'deep'"):
        resolve_budget("deep")
    with pytest.raises(ValueError, match="lengths must be positive integers in increasing order"):
        Budget(lengths=(33, 17))
    report = audit_attention(kernels.tiled_16_no_rescale, seed=0, checks=["reference"], dtypes=F32,
                             budget=Budget(lengths=(40, 50), head_sizes=(), batches=()))
    assert report["reference"].counterexample is not None
    assert report["reference"].counterexample["s"] == 40


# --- the command line -------------------------------------------------------------------------------------


def test_the_command_line_with_infer_catches_the_16_key_kernel_at_17_keys(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "tests.support.kernels:tiled_16_no_rescale", "--infer", "--checks", "reference", "--dtypes",
            "float32"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert '"s": 17' in out
    assert main([*argv, "--budget", "quick"]) == 0
    capsys.readouterr()
    assert main([*argv, "--lengths", "50,40", "--head-sizes", "64", "--batch", "5"]) == 1
    assert '"s": 40' in capsys.readouterr().out


def test_the_command_line_batch_flag_reaches_the_batch_chunk_bug(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "tests.support.kernels:batch_chunks", "--infer", "--checks", "masking", "--dtypes", "float32",
            "--max-examples", "3"]
    assert main([*argv, "--batch", "6", "--deep-examples", "4"]) == 1
    assert '"b": 6' in capsys.readouterr().out
    assert main([*argv, "--deep-examples", "0"]) == 0


def test_the_command_line_audits_half_precision_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:fp16_overflow", "--infer", "--checks", "large_logits",
                 "--deep-examples", "0"]) == 1
    out = capsys.readouterr().out
    assert "dtypes float32, float64, float16, bfloat16" in out.splitlines()[0]
    assert re.search(r"^large_logits +float16 +FAIL", out, re.MULTILINE), out
    # the quick budget is the audit before budgets: float32 and float64 unless --dtypes names more
    assert main(["audit", "tests.support.kernels:fp16_overflow", "--infer", "--checks", "large_logits",
                 "--budget", "quick"]) == 0
    out = capsys.readouterr().out
    assert "dtypes float32, float64, " in out.splitlines()[0]
    assert "float16 and bfloat16 (budget='quick'; dtypes= audits them)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget", "quick", "--lengths", "17"], "--lengths sets the deep examples, which --budget quick leaves out"),
    (["--budget", "quick", "--batch", "5"], "--batch sets the deep examples, which --budget quick leaves out"),
])
def test_deep_flags_with_the_quick_budget_give_one_line_and_exit_2(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.kernels:tiled_attention", *argv]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"typed-transformer: error: {message}"]


@pytest.mark.parametrize("flag", ["--lengths", "--head-sizes", "--batch"])
def test_bad_size_lists_exit_2(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["audit", "tests.support.kernels:tiled_attention", flag, "0,17"])
    assert exit_.value.code == 2
    assert "expected comma-separated positive integers, got '0,17'" in capsys.readouterr().err


# --- past 8 heads and batches, the widest example, thorough (issue 42) ----------------------------------------------

OLD_SIZES = {"batches": (5, 8, 9), "heads": (5, 6, 8)}  # the default's lists before issue 42


def test_a_kernel_wrong_past_8_heads_is_caught_by_default_at_12_heads_and_was_not_before() -> None:
    example = failing(kernels.heads_past_8, "reference", dtypes=F32)
    assert example["h"] == 12  # shrunk to the smallest failing listed count
    assert example["t"] <= 6
    old = audit_attention(kernels.heads_past_8, conventions="infer", seed=0, checks=["reference"], dtypes=F32,
                          budget=Budget(**OLD_SIZES))  # type: ignore[arg-type]
    assert old.passed, old.table()


def test_a_kernel_wrong_past_batch_8_is_caught_by_default_at_batch_9() -> None:
    example = failing(kernels.batch_past_8, "reference", dtypes=F32)
    assert example["b"] == 9
    assert example["h"] == 5  # the head count searched down too, the batch held


def test_the_widest_and_longest_examples_are_drawn_at_each_lists_largest() -> None:
    """A kernel that refuses one size at the top of each list: only the widest (or longest) example reaches it."""
    seen: set[tuple[int, int, int]] = set()

    def recording(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
        seen.add((q.shape[0], q.shape[1], k.shape[-2]))
        return kernels.paper_kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    budget = Budget(lengths=(20, 40), head_sizes=(), batches=(7, 11), heads=(3, 13), deep_examples=1)
    report = audit_attention(recording, seed=0, checks=["reference"], dtypes=F32, budget=budget)
    assert report.passed, report.table()
    assert any(b == 11 and h == 13 for b, h, _ in seen), sorted(seen)
    assert any(s == 40 for _, _, s in seen), sorted(seen)


def test_the_thorough_budget_adds_long_rows_and_many_heads() -> None:
    thorough = BUDGETS["thorough"]
    assert thorough.lengths[-4:] == (512, 1024, 2048, 4096)
    assert thorough.heads[-2:] == (32, 64)
    assert set(BUDGETS["default"].lengths) < set(thorough.lengths)
    assert BUDGETS["default"].heads == (5, 6, 8, 12, 16)
    assert BUDGETS["default"].batches == (5, 8, 9, 12, 16)


def test_past_512_keys_an_example_has_one_batch_element_and_at_most_two_heads() -> None:
    seen: list[tuple[int, int, int]] = []

    def recording(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
        seen.append((q.shape[0], q.shape[1], k.shape[-2]))
        return kernels.paper_kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    report = audit_attention(recording, seed=0, checks=["reference"], dtypes=F32, max_examples=2,
                             budget=Budget(lengths=(600,), head_sizes=(), batches=(), deep_examples=2))
    assert report.passed, report.table()
    long = [(b, h) for b, h, s in seen if s == 600]
    assert long
    assert all(b == 1 and h <= 2 for b, h in long), long


def test_the_command_line_heads_flag_and_the_thorough_budget(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "tests.support.kernels:heads_past_8", "--infer", "--checks", "reference", "--dtypes", "float32"]
    assert main([*argv, "--heads", "5,6,8", "--batch", "5,8,9"]) == 0
    capsys.readouterr()
    assert main([*argv, "--heads", "9"]) == 1
    assert '"h": 9' in capsys.readouterr().out
    assert main(["audit", "tests.support.kernels:half_sums_past_512", "--infer", "--budget", "thorough", "--checks",
                 "reference", "--dtypes", "float16", "--deep-examples", "2"]) == 1
    assert '"s": 1024' in capsys.readouterr().out  # shrunk to the smallest failing length past 512


def test_a_half_precision_running_sum_spilled_past_512_keys_fails_thorough_and_passes_the_default() -> None:
    kernel = kernels.half_sums_past_512
    default = audit_attention(kernel, conventions="infer", seed=0, checks=["reference"])
    assert default.passed, default.table()  # the default's lengths stop at 129
    thorough = audit_attention(kernel, conventions="infer", seed=0, checks=["reference"], budget="thorough")
    rows = {r.dtype: r for r in thorough.results}
    assert rows["float32"].status == rows["float64"].status == "PASS"
    float16 = rows["float16"]
    assert float16.status == "FAIL"
    assert float16.counterexample is not None
    assert float16.counterexample["s"] == 1024
    assert float16.counterexample["shift"] == 1.0
    assert float16.ratio is not None
    assert float16.ratio > 3 * 2  # the tolerance is 2: more than 3x over the line
    assert rows["bfloat16"].status == "FAIL"  # bfloat16 sums of bfloat16 inputs: 2.4, just over (docs/audit.md)
