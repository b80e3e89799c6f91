"""The candidate in its own process (``isolate=True``; the command line's default for a function): a candidate that
ends, crashes, forks or hangs its process FAILs in one line and the command exits 1 (in process, ``os._exit(0)``
exited 0 with no output); a patch it makes when imported never reaches the reference; a correct candidate passes
with the same rows as in process; its exceptions, gradients and state changes read as they do in process."""

import math
import sys
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.support import isolation_candidates as cands
from typed_transformer.audit import AuditUsageError, CandidateStopped, audit_attention, call_time_limit
from typed_transformer.audit.core.isolation import IsolatedCandidate
from typed_transformer.cli import main

HERE = "tests.support.isolation_candidates"


def _last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize(("name", "what"), [
    ("exits_quietly", "ended its process in its own process with exit status 0 (os._exit, exit, or a fork whose "
                      "parent exited) without returning; the audit stopped there"),
    ("segfaults", "was killed by SIGSEGV in its own process (a crash, a signal or the memory limit); the audit "
                  "stopped there"),
    ("killed_as_by_the_memory_limit", "was killed by SIGKILL in its own process (a crash, a signal or the memory "
                                      "limit); the audit stopped there"),
])
def test_a_candidate_that_ends_its_process_fails_in_one_line_and_the_command_exits_1(
        name: str, what: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", f"{HERE}:{name}", "--budget", "quick", "--dtypes", "float64"]) == 1
    line = _last_line(capsys)
    assert line.startswith(f"audit of {HERE}:{name}: FAIL: a call of the candidate in check reference [float64] (b=")
    assert line.endswith(what)


def test_a_candidate_that_exits_after_a_few_right_answers_stops_the_audit_where_it_did() -> None:
    with pytest.raises(CandidateStopped) as info:
        audit_attention(IsolatedCandidate(f"{HERE}:exits_after_a_few_calls"), budget="quick",
                        dtypes=(torch.float64,))
    assert "ended its process in its own process with exit status 0" in info.value.line()
    assert info.value.example is not None
    assert info.value.example.t * info.value.example.s > 12  # the call that ended it, named


def test_a_candidate_that_forks_and_exits_its_parent_is_named() -> None:
    with pytest.raises(CandidateStopped) as info:
        audit_attention(IsolatedCandidate(f"{HERE}:forks_and_exits_its_parent"), budget="quick",
                        dtypes=(torch.float64,), checks=["reference"])
    text = info.value.line()
    assert ("forked in its own process, and the answer came from the fork" in text
            or "ended its process in its own process with exit status 0" in text), text


def test_a_hung_call_is_killed_at_the_time_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", f"{HERE}:hangs", "--budget", "quick", "--dtypes", "float64", "--call-time-limit",
                 "1"]) == 1
    assert _last_line(capsys).endswith("did not return within the time limit of 1 s per call; the audit stopped "
                                       "there")


def test_an_import_time_patch_of_math_sqrt_stays_in_the_candidates_process(capsys: pytest.CaptureFixture[str]
                                                                           ) -> None:
    """In process, the module's patch made the reference's 1/sqrt(d) equal 1 and the no-scale candidate passed
    --infer with 'scale = None ... 1/sqrt(d)'. Isolated, the parent never imports it."""
    before = math.sqrt
    code = main(["audit", "tests.support.isolation_sly:no_scale_behind_a_patched_sqrt", "--infer", "--budget",
                 "quick", "--dtypes", "float64"])
    out = capsys.readouterr().out
    assert math.sqrt is before
    assert "tests.support.isolation_sly" not in sys.modules
    assert "  scale = 1.0: logit scale 1 at d=2 and d=8, s=4 and s=7: a constant, not 1/sqrt(d)" in out
    assert code == 3, out  # every check passes under the inferred scale of 1 (SDPA's top-left causal mask): both
    # are undeclared differences from the paper's attention


def test_a_correct_candidate_passes_with_the_same_rows_as_in_process() -> None:
    isolated = audit_attention(cands.correct, conventions="infer", budget="quick", isolate=True)
    in_process = audit_attention(cands.correct, conventions="infer", budget="quick")
    assert isolated.passed, isolated.table()
    assert [(r.name, r.dtype, r.status, r.examples) for r in isolated.results] == [
        (r.name, r.dtype, r.status, r.examples) for r in in_process.results]
    assert isolated.inferred[1:] == in_process.inferred[1:]  # the first line carries the timing


def test_an_exception_in_its_own_process_reads_as_in_process() -> None:
    kwargs: dict[str, Any] = {"budget": "quick", "dtypes": (torch.float64,), "checks": ["reference"]}
    isolated = audit_attention(cands.raises_past_4_keys, isolate=True, **kwargs)
    in_process = audit_attention(cands.raises_past_4_keys, **kwargs)
    assert isolated.results[0].status == in_process.results[0].status == "FAIL"
    assert isolated.results[0].message == in_process.results[0].message
    assert isolated.results[0].message.startswith("candidate raised ValueError: at most 4 keys (got ")


def test_state_changes_in_its_own_process_are_named_and_gradients_cross() -> None:
    report = audit_attention(cands.turns_gradients_off, isolate=True, budget="quick", dtypes=(torch.float64,),
                             checks=["reference", "gradients"])
    assert torch.is_grad_enabled()
    assert report.passed, report.table()  # put back in the child after each call: the gradients check passes
    assert report.state_changes == ["gradients enabled: True -> False"]


def test_a_candidate_its_process_cannot_import_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def local(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return q

    with pytest.raises(AuditUsageError, match=r"isolate=True needs a candidate its own process can import by name"):
        audit_attention(local, isolate=True)
    assert main(["audit", "tests.support.no_such_module:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("typed-transformer: error: cannot import tests.support.no_such_module:f: ModuleNotFoundError: No "
                   "module named 'tests.support.no_such_module'")


def test_no_isolate_calls_the_candidate_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with call_time_limit(5):
        assert main(["audit", f"{HERE}:correct", "--no-isolate", "--budget", "quick", "--dtypes", "float64",
                     "--checks", "reference"]) == 0
    assert "float64: 1 passed" in capsys.readouterr().out


@pytest.mark.parametrize(("candidate", "what"), [(cands.wrong_without_gradients, "torch.no_grad()"),
                                                 (cands.wrong_in_inference_mode, "torch.inference_mode()")])
def test_the_callers_grad_and_inference_mode_reach_its_process(candidate: Any, what: str) -> None:
    report = audit_attention(candidate, isolate=True, budget="quick", dtypes=(torch.float64,), checks=["reference"])
    (row,) = report.results
    assert row.status == "FAIL"
    assert row.message.startswith(f"output under {what}: max error")


def test_an_output_whose_unpickling_runs_code_never_runs_in_the_audit(tmp_path: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = audit_attention(cands.returns_a_pickle_that_runs_code, isolate=True, budget="quick",
                             dtypes=(torch.float64,), checks=["reference"])
    assert report.results[0].status == "FAIL"
    assert report.results[0].message.startswith("returned _Evil, expected a tensor")
    assert not (tmp_path / "isolation_evil_ran").exists()
    report = audit_attention(cands.returns_a_tuple, isolate=True, budget="quick", dtypes=(torch.float64,),
                             checks=["reference"])
    assert report.results[0].message == audit_attention(cands.returns_a_tuple, budget="quick",
                                                        dtypes=(torch.float64,), checks=["reference"]
                                                        ).results[0].message


def test_isolation_is_for_functions_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--isolate"]) == 2
    assert capsys.readouterr().err.strip() == ("typed-transformer: error: --isolate audits a candidate function; a "
                                               "--module is audited in process")
    with pytest.raises(AuditUsageError, match=r"isolate=True calls the candidate on the CPU only .*meta device"):
        audit_attention(cands.correct, isolate=True, device="meta")


def test_an_input_changed_in_place_in_its_own_process_is_named_as_in_process() -> None:
    def kwargs() -> dict[str, Any]:
        return {"budget": "quick", "dtypes": (torch.float64,), "checks": ["reference"]}

    from tests.support import audit_candidates

    isolated = audit_attention(audit_candidates.modifies_query, isolate=True, **kwargs())
    in_process = audit_attention(audit_candidates.modifies_query, **kwargs())
    assert isolated.results[0].message == in_process.results[0].message
    assert "the candidate modified its input q in place during the call" in isolated.results[0].message


@pytest.mark.parametrize("isolate", [True, False])
@pytest.mark.parametrize(("candidate", "row"), [
    ("lying_mean_of_values", "reference"), ("raises_skip", "reference"), ("ignores_the_mask", "masking"),
])
def test_wrong_candidates_fail_isolated_and_not(candidate: str, row: str, isolate: bool,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """In the API and on the command line: a lying tensor subclass, the audit's own Skip, an ignored mask."""
    kwargs: dict[str, Any] = {"budget": "quick", "dtypes": (torch.float64,), "checks": ["reference", "masking"]}
    report = audit_attention(getattr(cands, candidate), isolate=isolate, **kwargs)
    assert report.status(row) == "FAIL", report.table()
    assert not report.passed
    if candidate == "lying_mean_of_values":  # named, isolated or not
        assert report.state_changes == ["its output is a Liar, a tensor subclass: judged as the plain tensor it "
                                        "holds (the subclass's own methods are never asked)"]
    flag = "--isolate" if isolate else "--no-isolate"
    assert main(["audit", f"{HERE}:{candidate}", flag, "--budget", "quick", "--dtypes", "float64", "--checks",
                 "reference,masking"]) == 1
    assert f"{row:<9}  float64  FAIL" in capsys.readouterr().out


def test_a_module_that_ends_its_process_when_imported_is_one_line_and_exit_2(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ends_at_import.py").write_text("import os\nos._exit(0)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "ends_at_import:f"]) == 2
    assert capsys.readouterr().err.strip() == (
        "typed-transformer: error: cannot import ends_at_import:f: it ended its process while it was imported in its "
        "own process with exit status 0 (os._exit, exit, or a fork whose parent exited) without returning")
