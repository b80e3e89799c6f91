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
    [[], ["bench"], ["bench", "attention", "--seconds", "-1"], ["bench", "attention", "--threads", "x"], ["nope"]],
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
