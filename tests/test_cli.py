"""The command line."""

import pytest

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
