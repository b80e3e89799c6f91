"""The command line."""

import subprocess
import sys
from pathlib import Path

import pytest

from typed_transformer import cli
from typed_transformer.cli import main


def test_bench_attention_prints_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "attention", "--size", "small", "--seconds", "0.05", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "torch nn.MultiheadAttention" in out
    assert "ours sdpa, checks on" in out
    assert "1.00x" in out  # torch against itself


@pytest.mark.parametrize(
    "argv",
    [["bench"], ["bench", "attention", "--seconds", "-1"], ["bench", "attention", "--threads", "x"], ["nope"]],
)
def test_bad_arguments_give_one_line_and_exit_code_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("typed-transformer")
    assert "error:" in err


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


def test_bench_outside_a_checkout_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "BENCHMARKS", tmp_path / "benchmarks" / "bench.py")
    monkeypatch.delitem(sys.modules, "typed_transformer_benchmarks", raising=False)
    assert main(["bench", "attention", "--size", "small"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("typed-transformer: error: bench runs the scripts in a source checkout's benchmarks/")


def test_benchmarks_run_as_a_script() -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
    assert script == cli.BENCHMARKS
    done = subprocess.run([sys.executable, str(script), "attention", "--size", "small", "--seconds", "0.05",
                           "--threads", "1"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "ours sdpa, checks on" in done.stdout
