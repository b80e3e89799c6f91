"""The command line's flags and config files generated from dataclass fields (``typed_transformer._options``), on
a dataclass of every kind of field: the flags argparse gets, their one-line errors, and the TOML file checked by
the same records."""

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from typed_transformer._options import add_flags, flags_of, read_config, values_of


@dataclass(frozen=True)
class Toy:
    width: int = field(default=8, metadata={"help": "width", "range": (1, 64)})
    rate: float = field(default=0.1, metadata={"help": "rate", "interval": "(0, 1]", "noun": "a rate",
                                               "flag": "lr"})
    kind: Literal["a", "b"] = field(default="a", metadata={"help": "kind"})
    bias: bool = field(default=False, metadata={"help": "bias"})
    pre_norm: bool = field(default=True, metadata={"help": "post-norm instead", "flag": "post_norm", "store": False})
    path: Path | None = field(default=None, metadata={"help": "a file"})
    name: str | None = field(default=None, metadata={"help": "a name"})
    fresh: bool = field(default=False, metadata={"help": "fresh", "store": True, "exclusive": "start",
                                                 "in_file": False})
    again: bool = field(default=False, metadata={"help": "again", "store": True, "exclusive": "start",
                                                 "in_file": False})
    hidden: int = 3  # no help: not a flag


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def _parser(defaults: dict[str, object] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="toy")
    add_flags(parser, flags_of(Toy))
    if defaults:
        parser.set_defaults(**defaults)
    return parser


def test_every_field_with_help_is_a_flag_and_only_given_ones_override() -> None:
    assert [flag.option for flag in flags_of(Toy)] == ["--width", "--lr", "--kind", "--bias", "--post-norm", "--path",
                                                       "--name", "--fresh", "--again"]
    args = _parser().parse_args(["--width", "16", "--lr", "0.5", "--kind", "b", "--no-bias", "--post-norm",
                                 "--path", "x.txt", "--name", "n", "--fresh"])
    assert values_of(args, Toy) == {"width": 16, "rate": 0.5, "kind": "b", "bias": False, "pre_norm": False,
                                    "path": Path("x.txt"), "name": "n", "fresh": True}
    assert values_of(_parser().parse_args([]), Toy) == {}  # nothing given: the dataclass's defaults stand
    assert [f.default for f in flags_of(Toy, own_defaults=True)][:3] == [8, 0.1, "a"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--width", "0"], "argument --width: expected an integer from 1 to 64, got '0'"),
    (["--width", "2.5"], "argument --width: expected an integer, got '2.5'"),
    (["--lr", "0"], "argument --lr: expected a rate in (0, 1], got '0'"),
    (["--lr", "nan"], "argument --lr: expected a rate in (0, 1], got 'nan'"),
    (["--kind", "c"], "argument --kind: invalid choice: 'c'"),
    (["--fresh", "--again"], "argument --again: not allowed with argument --fresh"),
])
def test_bad_values_are_refused_with_the_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        _parser().parse_args(argv)


def test_a_config_file_is_checked_by_the_same_records_and_the_flags_override_it(tmp_path: Path) -> None:
    toml = tmp_path / "toy.toml"
    toml.write_text('width = 32\nlr = 0.25\nkind = "b"\nbias = true\npost-norm = true\npath = "p"\n',
                    encoding="utf-8")
    defaults = read_config(toml, flags_of(Toy))
    assert defaults == {"width": 32, "rate": 0.25, "kind": "b", "bias": True, "pre_norm": False, "path": Path("p")}
    args = _parser(defaults).parse_args(["--width", "4"])
    assert values_of(args, Toy)["width"] == 4
    assert values_of(args, Toy)["rate"] == 0.25


@pytest.mark.parametrize(("text", "message"), [
    ("widht = 3\n", "unknown key 'widht' (known: bias, kind, lr, name, path, post_norm, width)"),
    ("fresh = true\n", "unknown key 'fresh'"),
    ("width = 100\n", "width: expected an integer from 1 to 64, got '100'"),
    ("width = \"3\"\n", "width: expected a number, got '3'"),
    ("lr = true\n", "lr: expected a number, got True"),
    ("kind = \"c\"\n", "kind: expected one of a, b, got 'c'"),
    ("bias = \"yes\"\n", "bias: expected true or false, got 'yes'"),
    ("path = 1\n", "path: expected a path (a string), got 1"),
    ("name = 1\n", "name: expected a string, got 1"),
])
def test_a_bad_config_file_is_one_reason(text: str, message: str, tmp_path: Path) -> None:
    toml = tmp_path / "toy.toml"
    toml.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"^--config ") as raised:
        read_config(toml, flags_of(Toy))
    assert str(raised.value).startswith(f"--config {toml}: {message}")
    assert "\n" not in str(raised.value)


def test_misspelt_metadata_is_an_error() -> None:
    @dataclass
    class Typo:
        width: int = field(default=1, metadata={"help": "width", "rnage": (1, 2)})

    with pytest.raises(TypeError, match="unknown flag metadata \\['rnage'\\]"):
        flags_of(Typo)
