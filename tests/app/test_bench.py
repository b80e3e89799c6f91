"""benchmarks/bench.py: a script of the repository, not part of the package (which never imports it)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.bench import BareTorchAttention, main
from tests.support.limits import HANG_SECONDS
from typed_transformer.cli import main as cli_main


def test_bench_attention_prints_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attention", "--size", "small", "--seconds", "0.05", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "torch nn.MultiheadAttention" in out
    assert "ours sdpa, checks on" in out
    assert "1.00x" in out  # torch against itself
    assert "bare torch ops (the floor)" in out


def test_the_floor_row_computes_what_torchs_module_computes() -> None:
    """The bench's floor is the same math as bare torch calls: outputs and weight gradients equal torch's module."""
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(3, 7, 64)
    bare = BareTorchAttention(reference)(x)[0]
    torch.testing.assert_close(bare, reference(x, x, x, need_weights=False)[0])
    grads = torch.autograd.grad(bare.square().sum(), [reference.in_proj_weight, reference.out_proj.weight])
    expected = torch.autograd.grad(reference(x, x, x, need_weights=False)[0].square().sum(),
                                   [reference.in_proj_weight, reference.out_proj.weight])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("argv", [[], ["attention", "--seconds", "-1"], ["attention", "--threads", "x"],
                                  ["gpt", "--presets", ","], ["gpt", "--presets", "huge"], ["nope"]])
def test_bad_arguments_give_one_line_and_exit_code_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse prints the usage line first
    assert last.startswith("benchmarks/bench.py")
    assert "error:" in last


def test_an_empty_preset_list_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["gpt", "--presets", ","])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "benchmarks/bench.py: error: --presets: no preset in ',' (choose baby, seed, or both: baby,seed)")


def test_the_command_line_has_no_bench_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["bench", "attention"])
    assert info.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_the_package_never_imports_benchmarks() -> None:
    """Neither an import statement nor a file loaded by path (importlib's spec_from_file_location)."""
    package = Path(__file__).resolve().parents[2] / "src" / "typed_transformer"
    offenders = []
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "benchmarks" for name in names) or (
                    isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location"):
                offenders.append(f"{path.name}:{getattr(node, 'lineno', '?')}")
    assert not offenders


def test_gpt_generation_table_states_the_cache_ceiling() -> None:
    from benchmarks.bench import GPTRow, format_gpt_table

    table = format_gpt_table([], [GPTRow("generate 9 tokens, baby preset", 10.0, 20.0, 0.0, 0.0)], (0.5, 1.25))
    assert "generate 9 tokens, baby preset" in table
    assert "   2.00x" in table  # speedup = no cache / cache
    assert table.endswith("one cached one-token step 0.500 ms, one uncached 64-token window 1.250 ms: a KV cache "
                          "can speed up baby-preset generation by at most 2.50x here")


def test_generation_targets_compare_compiled_cache_with_the_faster_uncached_run() -> None:
    from benchmarks.bench import GenerationTargets, format_generation_targets

    # 10 tokens; eager uncached 300 ms beats compiled uncached 400 ms, so the compiled speed-up is 300 / 20.
    result = GenerationTargets(tokens=10, cache_ms=60.0, no_cache_ms=300.0, compiled_cache_ms=20.0,
                               compiled_no_cache_ms=400.0, matvec_ms=4.0, ours_hf_ms=50.0, hf_ms=55.0,
                               same_tokens_as_hf=10, compiled_same_tokens=9, rounds=3)
    assert (result.speedup, result.compiled_speedup, result.eager_bound) == (5.0, 15.0, 7.5)
    lines = format_generation_targets(result).splitlines()
    assert lines[1] == ("  seed preset, compiled (generate --compile): KV cache 2.00 ms/token, no cache 30.00 ms/token "
                        "(eager, the faster of eager 30.00 and compiled 40.00): cache speedup 15.00x (target >= 8x); "
                        "9/10 tokens the same as eager")
    assert lines[2].endswith("cache speedup 5.00x; its matrix-vector products alone take 4.00 ms/token, so eager "
                             "cannot pass 7.50x here")
    assert "ours / HF = 0.91x (target <= 1.00x); 10/10 tokens the same" in lines[3]


def test_benchmarks_run_as_a_script() -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench.py"
    done = subprocess.run([sys.executable, str(script), "attention", "--size", "small", "--seconds", "0.05",
                           "--threads", "1"], capture_output=True, text=True, timeout=HANG_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    assert "ours sdpa, checks on" in done.stdout


def test_main_job_profile_times_every_phase_and_restores_what_it_wrapped(tmp_path: Path) -> None:
    """benchmarks/main_job_profile.py: a tiny main job through the CLI, each phase counted as often as the run does
    it (evaluations at 0 and 2, the save's one-batch check), nothing left wrapped afterwards."""
    import torch

    from benchmarks import main_job_profile
    from typed_transformer import training

    before = (training.evaluate, torch.optim.AdamW.__init__, "step" in vars(torch.optim.AdamW), training.Trainer.step)
    text = tmp_path / "input.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 40, encoding="utf-8")
    profile, wall, cpu, output = main_job_profile.run(text, ["--eval-iters", "1", "--sample-tokens", "4",
                                                             "--threads", "1"], max_iters=2)
    assert (training.evaluate, torch.optim.AdamW.__init__, "step" in vars(torch.optim.AdamW),
            training.Trainer.step) == before
    calls = {key: phase.calls for key, phase in profile.phases.items()}
    assert calls == {"data": 2, "model": 2, "peak": 1, "optimizer": 1, "eval": 3, "batch": 2, "backward": 2,
                     "clip": 2, "step": 2, "save": 1, "plot": 1, "sample": 1}
    assert "iter     2:" in output
    assert 0 < sum(phase.wall for phase in profile.phases.values()) <= wall
    lines = main_job_profile.report(profile, wall, cpu, output, name="input.txt", extra=[], max_iters=2, start=0.01)
    assert lines[-1].split()[0] == "total"
    assert len(lines) == 2 + 3 + len(calls) + 2  # header, titles, start and imports, phases, rest, total


def test_time_to_quality_takes_the_first_evaluation_at_or_below_and_estimates_between() -> None:
    from benchmarks.time_to_quality import first_at_or_below, linear_crossing

    points = [(3.0, 0, 4.2), (13.0, 250, 2.4), (55.0, 1250, 1.9), (65.0, 1500, 1.8), (75.0, 1750, 1.95)]
    assert first_at_or_below(points, 1.886) == (65.0, 1500)
    assert linear_crossing(points, 1.886) == pytest.approx(55.0 + 10.0 * 0.014 / 0.1)
    assert linear_crossing(points, 1.7) is None  # never reached
    assert linear_crossing(points, 4.5) is None  # already at or below at the first evaluation
