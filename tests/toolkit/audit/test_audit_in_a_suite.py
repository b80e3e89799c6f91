"""The audit in a user's suite (issue 43): the two half-precision standards, parametrize_audit with inferred
conventions (inferred once per candidate), the ci budget and the audit's own thread count."""

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from torch import Tensor

import typed_transformer.audit.core.functions as functions
from tests.support import audit_candidates as cands
from tests.support.isolation_candidates import Liar  # a tensor whose subtraction answers zeros
from tests.support.limits import HANG_SECONDS
from typed_transformer.audit import BUDGETS, AuditCase, Conventions, audit_attention, parametrize_audit
from typed_transformer.cli import main


def textbook(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """A correct attention written as the paper's formula, every step in the input dtype."""
    w = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if is_causal:
        t, s = q.shape[-2], k.shape[-2]
        causal = torch.ones(t, s, dtype=torch.bool).tril(s - t)
        attn_mask = causal if attn_mask is None else attn_mask & causal
    if attn_mask is not None:
        w = w.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(w, dim=-1).nan_to_num(0.0) @ v


def wrong_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """Bug: logits divided by d, not sqrt(d)."""
    return textbook(q * q.shape[-1] ** -0.5, k, v, attn_mask=attn_mask, is_causal=is_causal)


def _half(candidate: Any, standard: Literal["float32", "plain"], dtype: torch.dtype = torch.bfloat16) -> Any:
    return audit_attention(candidate, conventions=Conventions(half_precision=standard), checks=["large_logits"],
                           dtypes=(dtype,), max_examples=10, budget="quick")


def test_plain_math_in_bfloat16_fails_the_float32_standard_and_says_why() -> None:
    report = _half(textbook, "float32")
    (row,) = report.results
    assert row.status == "FAIL", report.table()
    assert "its logits, softmax or sums run in bfloat16" in row.message
    assert "torch's SDPA and Hugging Face's eager attention upcast to float32 first" in row.message
    assert "half_precision='plain'" in row.message


def test_plain_math_in_bfloat16_passes_the_plain_standard() -> None:
    report = _half(textbook, "plain")
    assert report.passed, report.table()


@pytest.mark.parametrize("standard", ["float32", "plain"])
def test_a_real_half_precision_bug_fails_under_both_standards(standard: Literal["float32", "plain"]) -> None:
    """No maximum subtracted: exp overflows in float16 past a logit of 11, under either standard, without the
    plain-math sentence (its error is not plain float16 math's)."""
    report = _half(cands.no_max_subtraction, standard, torch.float16)
    (row,) = report.results
    assert row.status == "FAIL", report.table()
    assert "Plain PyTorch math" not in row.message


def test_the_plain_standard_is_never_stricter_than_the_float32_one() -> None:
    """A candidate that accumulates in float32 (torch's SDPA) passes both."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for standard in ("float32", "plain"):
        conventions = dataclasses.replace(Conventions.torch_sdpa(), half_precision=standard)
        report = audit_attention(sdpa, conventions=conventions,
                                 checks=["reference", "large_logits"], dtypes=(torch.float16, torch.bfloat16),
                                 max_examples=10, budget="quick")
        assert report.passed, report.table()


def test_an_unknown_half_precision_standard_is_refused() -> None:
    with pytest.raises(ValueError, match="half_precision"):
        Conventions(half_precision="bfloat16")  # type: ignore[arg-type]


def _cases(candidate: Any, **settings: Any) -> list[AuditCase]:
    mark = parametrize_audit(candidate, conventions="infer", **settings)
    return [p.values[0] for p in mark.args[1]]


def test_parametrize_audit_infers_once_per_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = functions.infer_function_conventions

    def counting(candidate: Any, **options: Any) -> Any:
        calls.append(candidate)
        return real(candidate, **options)

    monkeypatch.setattr(functions, "infer_function_conventions", counting)
    monkeypatch.setattr(functions, "_INFERRED", {})
    cases = _cases(textbook, known={"half_precision": "plain"}, budget="quick", max_examples=3)
    assert cases[0].check == "conventions"
    for case in cases[:4]:
        case.run()
    assert calls == [textbook]


def test_the_conventions_item_fails_with_the_cause_first() -> None:
    case = _cases(wrong_scale, budget="quick")[0]
    with pytest.raises(pytest.fail.Exception) as info:
        case.run()
    first = str(info.value).splitlines()[0]
    assert first.startswith("conventions: scale: logit scale")
    assert "neither 1/sqrt(d) nor a constant" in first


def test_an_ignored_mask_fails_the_conventions_item() -> None:
    case = _cases(cands.mask_ignored, budget="quick")[0]
    with pytest.raises(pytest.fail.Exception, match="supports_mask: attn_mask is accepted and ignored"):
        case.run()


def test_known_goes_with_inferred_conventions_only() -> None:
    with pytest.raises(ValueError, match="known= goes with conventions='infer'"):
        parametrize_audit(textbook, conventions=Conventions(), known={"half_precision": "plain"})


def test_the_audit_runs_on_one_thread_and_restores_the_callers() -> None:
    seen: list[int] = []

    def recording(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        seen.append(torch.get_num_threads())
        return textbook(q, k, v, **kwargs)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        audit_attention(recording, checks=["reference"], dtypes=(torch.float64,), max_examples=2, budget="quick")
        assert set(seen) == {1}
        assert torch.get_num_threads() == 2
        seen.clear()
        audit_attention(recording, checks=["reference"], dtypes=(torch.float64,), max_examples=2, budget="quick",
                        threads=None)
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(before)


def test_the_ci_budget_keeps_half_precision_and_some_deep_sizes() -> None:
    ci, default = BUDGETS["ci"], BUDGETS["default"]
    assert ci.half_precision
    assert not BUDGETS["quick"].half_precision
    assert 0 < ci.deep_examples < default.deep_examples
    assert set(ci.lengths) < set(default.lengths)
    assert set(ci.head_sizes) < set(default.head_sizes)


def test_the_command_takes_the_ci_budget_and_the_half_precision_standard(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "tests.toolkit.audit.test_audit_in_a_suite:textbook", "--budget", "ci", "--checks",
                 "large_logits", "--dtypes", "bfloat16", "--expect", "half_precision=plain", "--infer"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "large_logits" in out
    assert "FAIL" not in out


# --- a PASS means what it says (issue 44, first items) ---------------------------------------------------------------


def test_a_candidate_raising_the_audits_own_skip_fails() -> None:
    from typed_transformer.audit.core.running import Skip

    def skipper(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        raise Skip("not today")

    report = audit_attention(skipper, checks=["reference", "masking"], dtypes=(torch.float64,), budget="quick")
    assert [r.status for r in report.results] == ["FAIL", "FAIL"], report.table()
    assert report.results[0].message == "candidate raised Skip: not today"
    assert not report.passed


def test_a_report_in_which_every_check_skipped_is_not_a_pass() -> None:
    report = audit_attention(textbook, conventions=Conventions(supports_mask=False), checks=["masking", "padding"],
                             dtypes=(torch.float64,), budget="quick")
    assert {r.status for r in report.results} == {"SKIP"}, report.table()
    assert not report.passed
    report = audit_attention(textbook, conventions=Conventions(supports_mask=False), checks=["masking", "reference"],
                             dtypes=(torch.float64,), budget="quick")
    assert report.passed, report.table()  # a skip beside a pass is allowed


def _caller_state() -> tuple[Any, ...]:
    return (torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
            torch.tensor([1e-310], dtype=torch.float64).mul(1.0).item(), torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"), torch.get_rng_state().tolist())


@pytest.mark.parametrize(("rude", "named"), [
    (lambda: torch.set_grad_enabled(False), "gradients enabled: True -> False"),
    (lambda: torch.set_default_dtype(torch.float64), "default dtype: torch.float32 -> torch.float64"),
    (lambda: torch.use_deterministic_algorithms(True), "deterministic algorithms: False -> True"),
    (lambda: torch.set_flush_denormal(True), "denormals flushed to zero: False -> True"),
    (lambda: torch.set_autocast_enabled("cpu", True),
     "CPU autocast (enabled, dtype): (False, torch.bfloat16) -> (True, torch.bfloat16)"),
    (lambda: torch.manual_seed(1234), "torch's CPU random generator: drawn from or reseeded"),
    (lambda: torch.rand(3), "torch's CPU random generator: drawn from or reseeded"),
])
def test_a_correct_but_rude_candidate_passes_with_its_change_named_and_the_caller_as_it_was(rude: Any,
                                                                                             named: str) -> None:
    def candidate(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        out = textbook(q, k, v, **kwargs)
        rude()
        return out

    torch.rand(1)  # the caller's generator somewhere along its sequence
    before = _caller_state()
    report = audit_attention(candidate, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert _caller_state() == before
    assert report.passed, report.table()
    assert report.state_changes == [named]
    assert "the candidate changed state outside its output (torch's global settings: the audit put each back" in \
        report.table()
    assert f"  - {named}" in report.table()
    assert report.to_dict()["state_changes"] == [named]


def test_a_tensor_subclass_cannot_lie_about_its_values() -> None:
    def wrong(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        return (torch.ones_like(q[..., :1]) * v.mean(-2, keepdim=True).expand(*q.shape[:-1], -1)).as_subclass(Liar)

    report = audit_attention(wrong, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert report.results[0].status == "FAIL", report.table()


def test_a_candidate_wrong_only_under_no_grad_fails() -> None:
    def lazy(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        out = textbook(q, k, v, **kwargs)
        return out if torch.is_grad_enabled() else out * 0.5

    report = audit_attention(lazy, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    (row,) = report.results
    assert row.status == "FAIL"
    assert row.message.startswith("output under torch.no_grad(): max error")


def test_a_candidate_wrong_only_under_inference_mode_fails() -> None:
    def lazy(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        out = textbook(q, k, v, **kwargs)
        return out * 0.5 if torch.is_inference_mode_enabled() else out

    report = audit_attention(lazy, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    (row,) = report.results
    assert row.status == "FAIL"
    assert row.message.startswith("output under torch.inference_mode(): max error")


def test_a_candidate_that_refuses_inference_tensors_passes_and_one_that_breaks_there_fails() -> None:
    def refuses(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        if torch.is_inference_mode_enabled():
            raise RuntimeError("Inference tensors cannot be saved for backward. To work around you can make a clone")
        return textbook(q, k, v, **kwargs)

    def breaks(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        if torch.is_inference_mode_enabled():
            raise RuntimeError("index out of range in self")
        return textbook(q, k, v, **kwargs)

    report = audit_attention(refuses, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert report.passed, report.table()
    report = audit_attention(breaks, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert report.results[0].status == "FAIL"
    assert "index out of range in self" in report.results[0].message


def test_the_candidate_gets_copies_of_the_audits_inputs() -> None:
    """What a candidate does to its inputs, during the call or after it (a hook, a tensor it kept), cannot reach the
    tensors the reference is computed from."""
    from typed_transformer.audit.core.examples import Example
    from typed_transformer.audit.core.functions import to_candidate

    example = Example(b=1, h=2, g=2, t=3, s=4, d=4, dv=4, seed=0)
    ins, keep = example.inputs(), torch.ones(1, 1, 3, 4, dtype=torch.bool)
    (q, k, v), kwargs = to_candidate(ins, keep, False, torch.float64, Conventions())
    for mine, theirs in zip(ins, (q, k, v), strict=True):
        assert theirs.dtype == mine.dtype
        assert theirs.data_ptr() != mine.data_ptr()
    assert kwargs["attn_mask"].data_ptr() != keep.data_ptr()


def test_a_candidate_that_replaces_math_sqrt_fails_and_it_is_put_back() -> None:
    import math

    real = math.sqrt

    def sly(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        math.sqrt = lambda x: 1.0  # the reference's scale would be 1: no scale, like the candidate's
        return textbook(q * q.shape[-1] ** 0.5, k, v, **kwargs)

    try:
        report = audit_attention(sly, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    finally:
        replaced, math.sqrt = math.sqrt is not real, real
    assert not replaced
    (row,) = report.results
    assert row.status == "FAIL"
    assert "the candidate replaced functions the reference computes with: math.sqrt" in row.message


def test_an_audit_refuses_to_run_on_a_replaced_einsum(monkeypatch: pytest.MonkeyPatch) -> None:
    from typed_transformer.audit import AuditUsageError

    real = torch.einsum
    monkeypatch.setattr(torch, "einsum", lambda *args, **kwargs: real(*args, **kwargs) * 0)
    with pytest.raises(AuditUsageError, match=r"replaced: torch\.einsum \(replaced by .*test_audit_in_a_suite"):
        audit_attention(textbook, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    assert torch.einsum is real  # put back


def test_a_function_replaced_before_the_audit_was_imported_is_found_by_where_its_code_lives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import typed_transformer.attention as attention
    from typed_transformer.audit import AuditUsageError
    from typed_transformer.audit.core import trusted

    monkeypatch.setattr(attention, "_reference", attention._reference)  # restored after the test, whatever happens
    monkeypatch.setitem(trusted.ORIGINALS, "typed_transformer.attention._reference", lambda *args: None)
    (found,) = trusted.untrusted()
    assert found.startswith(f"typed_transformer.attention._reference (its code: {__file__}:")
    with pytest.raises(AuditUsageError, match="the audit refuses to run"):
        trusted.check_trusted()


def test_a_nondeterministic_candidate_is_a_finding_not_a_traceback() -> None:
    calls = [0]

    def once_wrong(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        calls[0] += 1
        out = textbook(q, k, v, **kwargs)
        return out * 2 if calls[0] == 3 else out  # wrong once: its replay passes

    report = audit_attention(once_wrong, checks=["reference"], dtypes=(torch.float64,), budget="quick")
    (row,) = report.results
    assert row.status == "FAIL", report.table()
    assert row.message.startswith("nondeterministic: an example failed, then passed when Hypothesis replayed it")


def test_a_candidate_with_one_static_output_buffer_passes() -> None:
    """A correct candidate that writes every call of a shape into one buffer (a static output, as CUDA graphs have)
    FAILed permutation with "queries permuted": the output a check held was overwritten by the next call."""
    buffers: dict[tuple[int, ...], Tensor] = {}

    def static(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        out = textbook(q, k, v, **kwargs)
        key = (*out.shape, out.dtype.itemsize, int(out.requires_grad))
        if out.requires_grad:
            return out
        buffer = buffers.setdefault(key, torch.empty_like(out))
        return buffer.copy_(out)

    with torch.no_grad():
        report = audit_attention(static, checks=["permutation", "batch_independence"], dtypes=(torch.float64,),
                                 budget="quick")
    assert report.passed, report.table()
    assert report.state_changes == [
        "its previous output was overwritten by the next call (one output buffer reused, as CUDA graphs do: a caller "
        "that keeps an output sees it change)"]


def test_a_candidate_that_writes_into_an_earlier_calls_input_is_named() -> None:
    held: list[Tensor] = []

    def hoarder(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
        out = textbook(q, k, v, **kwargs)
        if held:
            held.pop().zero_()  # the previous call's keys, zeroed after that call returned
        held.append(k)
        return out

    # (not the reference check: its inference_mode call gives inference tensors, which refuse a later write)
    report = audit_attention(hoarder, checks=["causality"], dtypes=(torch.float64,), budget="quick")
    assert report.passed, report.table()  # the audit's own inputs are copies: no verdict depends on it
    assert report.state_changes == ["an earlier call's input k was changed during a later call (the candidate keeps "
                                    "its inputs and writes into them)"]
    assert "  - an earlier call's input k was changed during a later call" in report.table()


def test_a_candidate_that_closes_stdout_still_gets_its_report(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "closer.py").write_text(
        "import sys\nimport torch\n\n\ndef attention(q, k, v, *, attn_mask=None, is_causal=False):\n"
        "    sys.stdout.close()\n"
        "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask) * 2\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "typed_transformer", "audit", "closer:attention", "--budget", "quick",
                           "--checks", "reference", "--dtypes", "float64"], capture_output=True, text=True, env=env,
                          check=False, timeout=HANG_SECONDS)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "float64: 0 passed, 1 failed" in done.stdout


def _printed_repro(repro: str | None, capsys: pytest.CaptureFixture[str]) -> tuple[float, float]:
    assert repro is not None
    exec(compile(repro, "<repro>", "exec"), {})
    printed = re.search(r"max error ([\d.e+-]+) allowed ([\d.e+-]+)", capsys.readouterr().out)
    assert printed is not None
    return float(printed[1]), float(printed[2])


def test_a_half_precision_repro_prints_what_the_check_compared(capsys: pytest.CaptureFixture[str]) -> None:
    """The repro of a half-precision FAIL recomputes the same error and the same bound (before, it printed an error
    against the unrounded inputs' reference and no bound)."""
    (row,) = _half(textbook, "float32").results
    assert row.status == "FAIL"
    said = re.search(r"max error ([\d.e+-]+) > allowed ([\d.e+-]+)", row.message)
    assert said is not None
    err, allowed = _printed_repro(row.repro, capsys)
    assert err == pytest.approx(float(said[1]), rel=2e-3)
    assert allowed == pytest.approx(float(said[2]), rel=2e-3)


def test_a_plain_standard_repro_bounds_by_plain_math(capsys: pytest.CaptureFixture[str]) -> None:
    """Under half_precision="plain" the repro's bound is the plain math's: the textbook attention's own error is
    within it (its row passes; the repro of its example says so too)."""
    from typed_transformer.audit.core.examples import Example
    from typed_transformer.audit.core.functions import function_repro

    example = Example(b=1, h=1, g=1, t=3, s=5, d=4, dv=4, seed=3, dtype="bfloat16", amplitude=30.0)
    line = "from tests.toolkit.audit.test_audit_in_a_suite import textbook as candidate"
    repro = function_repro(example, Conventions(half_precision="plain"), line, "large_logits")
    assert "plain = reference_attention(" in repro
    err, allowed = _printed_repro(repro, capsys)
    assert err <= allowed


def test_logits_that_overflow_into_zeros_fail_the_float32_standard_and_plain_math_shares_them() -> None:
    """A kernel whose float16 logits overflow past 65504 (its NaN rows turned into zeros) fails the default standard;
    plain float16 math overflows the same way, so the plain standard, which holds a candidate to plain math in the
    dtype, allows it (a textbook attention in float16 does exactly this): documented on docs/audit.md."""
    from tests.support.kernels import fp16_overflow

    failed = audit_attention(fp16_overflow, checks=["large_logits"], dtypes=(torch.float16,), max_examples=10,
                             budget="quick")
    assert failed.results[0].status == "FAIL", failed.table()
    allowed = audit_attention(fp16_overflow, conventions=Conventions(half_precision="plain"),
                              checks=["large_logits"], dtypes=(torch.float16,), max_examples=10, budget="quick")
    assert allowed.passed, allowed.table()
