"""``typed-transformer audit``: exit codes, table and JSON."""

import json
from pathlib import Path

import pytest

from tests.support.limits import HANG_SECONDS
from typed_transformer.audit import FUNCTION_CHECKS, MODULE_CHECKS
from typed_transformer.cli import main

# the small audit in float32 and float64: these tests are about the command, not the sizes (test_audit_depth.py)
QUICK = ["--max-examples", "4", "--budget", "quick", "--dtypes", "float32,float64"]


def test_audit_torch_sdpa_passes_with_its_conventions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sdpa.json"
    code = main(["audit", "torch.nn.functional:scaled_dot_product_attention", "--causal-alignment", "top-left",
                 "--fully-masked", "any", "--no-mask-with-causal", *QUICK, "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("audit of torch.nn.functional:scaled_dot_product_attention (seed 0")
    # fully_masked, mask_and_causal: declared
    assert out.rstrip().endswith("\nfloat32: 10 passed; float64: 10 passed; 2 checks skipped")
    assert "attn_mask and is_causal together (mask_with_causal=False)" in out
    data = json.loads(path.read_text())
    assert data["passed"] is True
    assert list(dict.fromkeys(r["name"] for r in data["results"])) == list(FUNCTION_CHECKS)


def test_audit_sdpa_with_bottom_right_declared_fails_causality(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "torch.nn.functional:scaled_dot_product_attention", "--checks", "causality", *QUICK])
    out = capsys.readouterr().out
    assert code == 1
    assert [line.split()[:3] for line in out.splitlines()[3:5]] == [["causality", "float32", "FAIL"],
                                                                    ["causality", "float64", "FAIL"]]


def test_audit_wrong_implementation_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "tests.support.audit_candidates:missing_scale", "--causal-alignment", "top-left",
                 "--fully-masked", "nan", *QUICK])
    out = capsys.readouterr().out
    assert code == 1
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()[3:3 + 2 * len(FUNCTION_CHECKS)]
            if line.split()[1] == "float32"}
    assert rows["scale"] == "FAIL"
    assert rows["reference"] == "FAIL"
    assert rows["dtype"] == "PASS"
    assert "q = randn((" in out  # the repro builds the counterexample plainly
    assert "out = candidate(qc, kc, vc" in out


def test_audit_other_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "tests.support.audit_candidates:bthd_attention", "--layout", "bthd", "--fully-masked", "zero",
                 *QUICK]) == 0
    assert main(["audit", "tests.support.audit_candidates:drop_mask_attention", "--mask-polarity", "drop", *QUICK,
                 "--checks", "masking,padding"]) == 0
    assert main(["audit", "tests.support.audit_candidates:plain_attention", "--no-mask", "--no-causal", *QUICK,
                 "--dtypes", "float64"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "no_such_module_xyz:f"], "cannot import no_such_module_xyz:f: ModuleNotFoundError"),
        (["audit", "torch.nn.functional:nope"], "cannot import torch.nn.functional:nope: AttributeError"),
        (["audit", "torch.nn.functional"], "candidate must be MODULE:ATTR"),
        (["audit"], "give a candidate MODULE:ATTR or --module MODULE:CLASS --spec NAME"),
        (["audit", "tests.support.audit_candidates:plain_attention"],
         "tests.support.audit_candidates:plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> "
         "torch.Tensor cannot be called as candidate(q, k, v, attn_mask=..., is_causal=...)"),
        (["audit", "--module", "torch.nn:MultiheadAttention"], "--spec: missing"),
        (["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--layout", "bthd"],
         "--layout describes a candidate function; a module's conventions come from its --spec"),
        (["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "nope"], "--spec: unknown spec 'nope'"),
        (["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config", "{"],
         "--config is not valid JSON"),
        (["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config", '{"nope": 1}'],
         "cannot build torch.nn:MultiheadAttention from --config: TypeError"),
        (["audit", "--module", "torch.nn:Linear", "--spec", "torch_mha", "--config", '{"in_features": 2, '
          '"out_features": 2}'], "torch.nn.modules.linear.Linear does not match spec 'torch_mha'"),
        (["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config",
          '{"embed_dim": 8, "num_heads": 2}', "--checks", "scale"], "--checks: unknown check 'scale'"),
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


@pytest.mark.parametrize("argv", [["audit", "m:f", "--layout", "tbhd"], ["audit", "m:f", "--seed", "-1"],
                                  ["audit", "m:f", "--mask-polarity", "yes"]])
def test_audit_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "error:" in err


def test_fully_masked_defaults_to_zero_as_in_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    # nan_rows gives NaN for fully masked rows: the default declaration (zero) must catch it
    assert main(["audit", "tests.support.audit_candidates:nan_rows", "--checks", "fully_masked", *QUICK]) == 1
    assert main(["audit", "tests.support.audit_candidates:nan_rows", "--checks", "fully_masked",
                 "--fully-masked", "nan", *QUICK]) == 0
    capsys.readouterr()


def test_audit_a_module_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mha.json"
    checks = ",".join(c for c in MODULE_CHECKS if c != "fast_path")
    code = main(["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config",
                 '{"embed_dim": 8, "num_heads": 2, "batch_first": true}', "--checks", checks, *QUICK,
                 "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("audit of torch.nn:MultiheadAttention (spec torch_mha)")
    data = json.loads(path.read_text())
    assert list(dict.fromkeys(r["name"] for r in data["results"])) == checks.split(",")
    assert data["conventions"]["spec"] == "torch_mha"
    assert data["conventions"]["fully_masked"] == "zero"
    # the fast path gives NaN for a fully padded batch element: a failure when zero is declared (the default) ...
    fast = ["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config",
            '{"embed_dim": 8, "num_heads": 2}', "--checks", "fast_path", *QUICK]
    assert main(fast) == 1
    assert "fully padded batch element gave [nan" in capsys.readouterr().out
    # ... and a pass when NaN is declared
    assert main([*fast, "--fully-masked", "nan"]) == 0
    capsys.readouterr()


def test_audit_infer_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "tests.support.audit_candidates:bthd_attention", "--infer", *QUICK, "--dtypes", "float64"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].startswith("inferred conventions (")
    assert "  layout = 'bthd': h=2, t=3, s=4 matches the reference in bthd" in lines
    assert main(["audit", "tests.support.audit_candidates:mask_ignored", "--infer", *QUICK, "--dtypes", "float64"]) == 1
    assert "supports_mask: attn_mask is accepted and ignored" in capsys.readouterr().out
    # a module: the spec says where the weights live, inference the behaviour
    code = main(["audit", "--module", "torch.nn:MultiheadAttention", "--spec", "torch_mha", "--config",
                 '{"embed_dim": 8, "num_heads": 2, "batch_first": true}', "--checks", "reference,causality",
                 "--infer", *QUICK, "--dtypes", "float64"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  causal_alignment = 'bottom-right': is_causal=True, t=2, s=4" in out
    # conventions flags beside --infer are what the user knows: confirmed, or a FAIL with the witness
    assert main(["audit", "tests.support.audit_candidates:bthd_attention", "--infer", "--layout", "bthd", *QUICK,
                 "--dtypes", "float64", "--checks", "reference"]) == 0
    assert "  layout = 'bthd': known (given), confirmed: h=2, t=3, s=4" in capsys.readouterr().out
    assert main(["audit", "tests.support.audit_candidates:bthd_attention", "--infer", "--causal-alignment", "top-left",
                 *QUICK, "--dtypes", "float64", "--checks", "reference"]) == 1
    assert ("causal_alignment: known causal_alignment='top-left'; behaves as 'bottom-right': is_causal=True, t=2, "
            "s=4") in capsys.readouterr().out


def test_audit_a_hugging_face_class_with_zero_lines_of_spec(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (extra audit-test)")
    code = main(["audit", "--module", "transformers.models.qwen2.modeling_qwen2:Qwen2Attention", "--spec", "hf",
                 "--infer", "--checks", "reference,masking,rope", *QUICK, "--dtypes", "float32"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("audit of transformers.models.qwen2.modeling_qwen2:Qwen2Attention (spec hf")
    assert "inferred conventions (" in out
    # the classic families too, from the import path alone (BERT's block: self-attention + output.dense)
    code = main(["audit", "--module", "transformers.models.bert.modeling_bert:BertAttention", "--spec", "hf",
                 "--infer", "--checks", "reference,masking", *QUICK, "--dtypes", "float32"])
    assert code == 0, capsys.readouterr().out
    code = main(["audit", "--module", "torch.nn:Bilinear", "--spec", "hf", "--infer"])
    assert code == 2
    assert "Bilinear: no config class found" in capsys.readouterr().err


def test_audit_gqa_passes_enable_gqa_to_torch_sdpa(capsys: pytest.CaptureFixture[str]) -> None:
    sdpa = ["audit", "torch.nn.functional:scaled_dot_product_attention", "--causal-alignment", "top-left",
            "--fully-masked", "any", "--no-mask-with-causal", *QUICK]
    assert main([*sdpa, "--gqa", "--checks", "reference,masking,gradients"]) == 0
    out = capsys.readouterr().out
    assert "grouped-query" not in out
    assert out.rstrip().endswith("\nfloat32: 3 passed; float64: 3 passed")


def test_audit_gqa_catches_a_grouping_bug_behind_enable_gqa(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "tests.support.audit_candidates:sdpa_gqa_tiled", "--causal-alignment", "top-left", "--gqa",
                 "--checks", "reference", "--dtypes", "float64", "--max-examples", "10", "--budget", "quick"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[3].split()[:3] == ["reference", "float64", "FAIL"]
    assert "enable_gqa=True" in out  # the repro's conventions pass it


def test_without_the_audit_extra_any_audit_flags_give_the_install_line_and_other_commands_skip_the_toolkit() -> None:
    """The conventions flags come from the toolkit's Conventions, imported only when the command is audit: without
    the [audit] extra (hypothesis blocked) audit says which extra to install whatever its flags, and a train
    command never imports the toolkit (its import costs about a second)."""
    import subprocess
    import sys

    from typed_transformer._install import install_hint

    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'hypothesis': raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from typed_transformer.cli import main\n"
            "try:\n"
            "    main(['train', '--max-iters', '0'])\n"
            "except SystemExit as exit_:\n"
            "    assert exit_.code == 2\n"
            "assert 'typed_transformer.audit' not in sys.modules\n"
            "sys.exit(main(['audit', 'torch.nn.functional:scaled_dot_product_attention', '--layout', 'bthd',"
            " '--no-mask']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == ("typed-transformer train: error: argument --max-iters: expected an integer from 1 to "
                        "1000000000, got '0'")
    assert lines[1].startswith(f"typed-transformer: error: audit needs the [audit] extra: {install_hint('audit')} (")
    assert len(lines) == 2


def test_the_conventions_flags_are_the_conventions_fields() -> None:
    """Every Conventions field with help text is an audit flag (its name or its flag name), and a given flag sets
    exactly its field: --no-mask clears supports_mask, --gqa sets supports_gqa, --scale parses a positive number."""
    import argparse
    from dataclasses import fields

    from typed_transformer.audit import Conventions
    from typed_transformer.cli import build_parser

    parser = build_parser()
    audit = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["audit"]
    options = {action.dest: action.option_strings[0] for action in audit._actions if action.option_strings}
    declared = {f.name: "--" + f.metadata.get("flag", f.name).replace("_", "-") for f in fields(Conventions)
                if "help" in f.metadata}
    assert {dest: options[dest] for dest in declared} == declared
    args = parser.parse_args(["audit", "m:f", "--no-mask", "--gqa", "--scale", "0.5", "--layout", "bthd"])
    given = {dest: getattr(args, dest) for dest in declared if getattr(args, dest) is not None}
    assert given == {"supports_mask": False, "supports_gqa": True, "scale": 0.5, "layout": "bthd"}
    assert Conventions(**given) == Conventions(supports_mask=False, supports_gqa=True, scale=0.5, layout="bthd")


@pytest.mark.parametrize("infer", [[], ["--infer"]], ids=["declared", "infer"])
@pytest.mark.parametrize(("candidate", "what"), [
    ("exits_on_first_call", "called sys.exit(0); the audit stopped there"),
    # a limit no correct call comes near is not needed here: this candidate never returns
    ("hangs", "did not return within the time limit of 0.2 s per call; the audit stopped there"),
])
def test_a_call_that_exits_or_hangs_fails_in_one_line(candidate: str, what: str, infer: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", f"tests.support.audit_candidates:{candidate}", *infer, *QUICK,
                 "--call-time-limit", "0.2"])
    out = capsys.readouterr().out
    assert code == 1
    where = "probing its conventions (--infer)" if infer else \
        "in check reference [float32] (b=1 h=1 g=1 t=1 s=1 d=1 dv=1, seed 0)"
    assert out == f"audit of tests.support.audit_candidates:{candidate}: FAIL: a call of the candidate {where} {what}\n"


def test_a_candidate_that_modifies_its_inputs_is_named_with_the_input_and_the_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.json"
    code = main(["audit", "tests.support.audit_candidates:modifies_query", *QUICK, "--checks", "reference",
                 "--dtypes", "float64", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    row = json.loads(path.read_text())["results"][0]
    assert row["status"] == "FAIL"
    assert row["message"] == ("the candidate modified its input q in place during the call (the counterexample's): "
                              "inputs must be left as given")
    assert row["counterexample"]["b"] >= 1  # the call: its example, with its repro in the table
    assert "out = candidate(qc, kc, vc)" in out  # the call, as a plain call of the candidate
