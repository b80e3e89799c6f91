"""``typed-transformer audit``: exit codes, table and JSON."""

import json
from pathlib import Path

import pytest

from typed_transformer.audit import CHECKS
from typed_transformer.cli import main

QUICK = ["--max-examples", "4"]


def test_audit_torch_sdpa_passes_with_its_conventions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sdpa.json"
    code = main(["audit", "torch.nn.functional:scaled_dot_product_attention", "--causal-alignment", "top-left",
                 *QUICK, "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("audit of torch.nn.functional:scaled_dot_product_attention (seed 0")
    assert out.rstrip().endswith("9 passed, 0 failed, 1 skipped")
    data = json.loads(path.read_text())
    assert data["passed"] is True
    assert [r["name"] for r in data["results"]] == list(CHECKS)


def test_audit_sdpa_with_bottom_right_declared_fails_causality(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "torch.nn.functional:scaled_dot_product_attention", "--checks", "causality", *QUICK])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[3].split()[:2] == ["causality", "FAIL"]


def test_audit_wrong_implementation_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "tests._audit_candidates:missing_scale", "--causal-alignment", "top-left",
                 "--fully-masked", "nan", *QUICK])
    out = capsys.readouterr().out
    assert code == 1
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:13]}
    assert rows["scale"] == "FAIL"
    assert rows["reference"] == "FAIL"
    assert rows["dtype"] == "PASS"
    assert rows["fully_masked"] == "PASS"
    assert "Example(" in out
    assert "candidate_call(example" in out


def test_audit_other_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests._audit_candidates:bthd_attention", "--layout", "bthd", "--fully-masked", "zero",
                 *QUICK]) == 0
    assert main(["audit", "tests._audit_candidates:drop_mask_attention", "--mask-polarity", "drop", *QUICK,
                 "--checks", "masking,padding"]) == 0
    assert main(["audit", "tests._audit_candidates:plain_attention", "--no-mask", "--no-causal", *QUICK,
                 "--dtypes", "float64"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "no_such_module_xyz:f"], "cannot import no_such_module_xyz:f: ModuleNotFoundError"),
        (["audit", "torch.nn.functional:nope"], "cannot import torch.nn.functional:nope: AttributeError"),
        (["audit", "torch.nn.functional"], "candidate must be MODULE:ATTR"),
        (["audit", "math:pi"], "math:pi is not callable"),
        (["audit", "math:sqrt", "--dtypes", "float8"], "--dtypes: unknown dtype 'float8'"),
        (["audit", "math:sqrt", "--checks", "speed"], "--checks: unknown check 'speed'"),
    ],
)
def test_audit_bad_candidate_gives_one_line_and_exit_2(argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"typed-transformer: error: {message}"] or (
        len(err.strip().splitlines()) == 1 and message in err)


@pytest.mark.parametrize("argv", [["audit"], ["audit", "m:f", "--layout", "tbhd"], ["audit", "m:f", "--seed", "-1"],
                                  ["audit", "m:f", "--mask-polarity", "yes"]])
def test_audit_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "error:" in err
