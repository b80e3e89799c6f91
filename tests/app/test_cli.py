"""The command line."""

import pytest

from typed_transformer.cli import main


@pytest.mark.parametrize(
    "argv",
    [["bench", "gpt"], ["generate"], ["train", "--lr", "x"], ["nope"]],
)
def test_bad_arguments_give_one_line_and_exit_code_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("typed-transformer")
    assert "error:" in err
