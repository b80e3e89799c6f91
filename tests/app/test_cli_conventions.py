"""The command line behaves as people expect of one: ``--version``, a bare command prints the usage, every
flag has help text, the progress bar only in a terminal, one spelling of install hints, refusals said once
under torchrun, and a user module that exits while it is imported."""

import argparse
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import typed_transformer
import typed_transformer._install as install
from tests.support.cli import TEXT, one_line, run, train_run
from tests.support.limits import HANG_SECONDS
from typed_transformer.checkpoint import CHECKPOINT_NAME
from typed_transformer.cli import build_parser, main

TINY = ["--block-size", "8", "--eval-interval", "5", "--eval-iters", "2", "--batch-size", "4", "--sample-tokens", "5"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return train_run(tmp_path_factory.mktemp("conventions"), 3, [*TINY, "--no-progress"])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"typed-transformer {typed_transformer.__version__}\n"


def test_a_bare_command_prints_the_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == build_parser().format_help()
    assert captured.err.startswith("usage: typed-transformer [-h] [--version]")
    assert all(command in captured.err for command in ("train", "generate", "attention", "audit"))


def _parsers(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                found += _parsers(child, f"{name} {sub}")
    return found


def test_every_flag_of_every_subcommand_has_help_text() -> None:
    from benchmarks.bench import build_parser as build_bench_parser

    parsers = _parsers(build_parser(), "typed-transformer") + _parsers(build_bench_parser(), "benchmarks/bench.py")
    assert {name for name, _ in parsers} >= {"typed-transformer train", "typed-transformer generate",
                                             "typed-transformer audit", "benchmarks/bench.py gpt"}
    missing = [f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
               for name, parser in parsers for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()]
    assert missing == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_the_progress_bar_only_in_a_terminal_and_it_ends_at_n_of_n(terminal: bool, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["train", "--data", str(text), "--max-iters", "7", *TINY, "--out", str(tmp_path / "run")]) == 0
    drawn = err.getvalue()
    if terminal:
        assert "\r" in drawn
        assert drawn.rsplit("\r", 1)[-1].startswith("train: 100%|##########| 7/7 ")  # the last draw: done
    else:
        assert "\r" not in drawn
        assert "it/s" not in drawn


def test_install_hints_fit_a_checkout_and_an_installed_package(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = Path(install.__file__).resolve().parents[2]
    assert install.install_hint("train") == f"pip install -e '{checkout}[train]'"  # this suite runs from one
    package = tmp_path / "site-packages" / "typed_transformer"
    package.mkdir(parents=True)
    monkeypatch.setattr(install, "__file__", str(package / "_install.py"))
    assert install.install_hint("train") == "pip install 'typed-transformer[train]'"


def test_every_message_spells_the_install_hint_one_way() -> None:
    source = Path(install.__file__).parent
    spelled = [f"{path.name}: {line.strip()}" for path in sorted(source.rglob("*.py")) if path.name != "_install.py"
               for line in path.read_text(encoding="utf-8").splitlines()
               if "pip install" in line and "[" in line and not line.lstrip().startswith(("#", "``", "Install"))]
    assert spelled == []


def test_the_missing_extra_list_names_every_missing_package(trained: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = trained
    for name in ("numpy", "tqdm", "matplotlib"):
        monkeypatch.setitem(sys.modules, name, None)
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"typed-transformer: error: train needs the [train] extra: {install.install_hint('train')} "
        "(missing: numpy, tqdm, matplotlib)")


def test_a_core_install_imports_without_numpy_s_warning() -> None:
    # numpy is a core dependency: torch's "Failed to initialize NumPy" cannot appear.
    import tomllib

    pyproject = tomllib.loads((Path(install.__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    assert any(d.startswith("numpy") for d in pyproject["project"]["dependencies"])
    result = subprocess.run([sys.executable, "-W", "error", "-c", "import typed_transformer"], capture_output=True,
                            text=True, timeout=HANG_SECONDS, check=False)
    assert result.returncode == 0
    assert "NumPy" not in result.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_rank_0_alone_says_a_refusal(rank: str, trained: tuple[Path, Path],
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Every rank checks the same files and arguments; a refusal is one line, from rank 0 only.
    text, out = trained
    monkeypatch.setenv("RANK", rank)
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    if rank == "0":
        assert one_line(err) == (f"typed-transformer: error: {out / CHECKPOINT_NAME} exists: continue that run with "
                                 "--resume or replace it with --overwrite")
    else:
        assert err == ""
    assert run(["train", "--lr", "fast"]) == 2
    assert (capsys.readouterr().err == "") == (rank == "1")


def test_generate_with_a_tiny_top_p_takes_the_most_likely_character(trained: tuple[Path, Path],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, out = trained
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--top-p", "1e-300", "--max-new-tokens", "10"]) == 0
    tiny = capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(out), "--greedy", "--max-new-tokens", "10"]) == 0
    assert tiny == capsys.readouterr().out


def test_audit_of_a_module_that_exits_while_imported(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert main(["audit", "exits_on_import:f"]) == 2
    assert one_line(capsys.readouterr().err) == ("typed-transformer: error: cannot import exits_on_import:f: "
                                                 "importing it called sys.exit(3)")




def test_the_train_flags_are_the_config_dataclasses_fields() -> None:
    """One source of truth: every config field with help text is a ``train`` flag with that help, under its
    name (or its ``flag`` name), and the presets are gpt.PRESETS'."""
    from dataclasses import fields

    import typed_transformer.cli as cli
    from typed_transformer.config import PRESET_TRAINING, PRESET_TRAINING_BY_OPTIMIZER, TrainConfig
    from typed_transformer.gpt import PRESETS, GPTConfig

    train = dict(_parsers(build_parser(), "typed-transformer"))["typed-transformer train"]
    by_dest = {action.dest: action for action in train._actions}
    flagged = [(cls, f) for cls in (GPTConfig, TrainConfig, cli.TrainCommand) for f in fields(cls)
               if "help" in f.metadata]
    assert len(flagged) == len(by_dest) - 1  # all but --help
    for cls, f in flagged:
        action = by_dest[f.name]
        assert action.option_strings[0] == "--" + f.metadata.get("flag", f.name).replace("_", "-")
        assert f.name == "preset" or action.help == f.metadata["help"]
        assert action.default == (f.default if cls is cli.TrainCommand else None)  # None: the preset's value
    assert by_dest["preset"].choices == list(PRESETS)
    assert set(PRESET_TRAINING) == set(PRESETS)
    described = dict(part.split(": ", 1) for part in (by_dest["preset"].help or "").split("; "))
    assert described.pop("other settings") == "the flags' defaults"
    assert [name.removesuffix(" (default)") for name in described] == list(PRESETS)
    for name, settings in described.items():  # every setting of each preset, from PRESETS and PRESET_TRAINING
        preset = name.removesuffix(" (default)")
        other = [f"with --optimizer {optimizer}: " + " and ".join(f"{key} {value}" for key, value in changed.items())
                 for optimizer, changed in PRESET_TRAINING_BY_OPTIMIZER.get(preset, {}).items()]
        assert settings.split(", ") == [f"{key} {value:g}" if type(value) is float else f"{key} {value}"
                                        for key, value in {**PRESETS[preset], **PRESET_TRAINING[preset]}.items()
                                        ] + other
    for module in ("cli.py", "_options.py"):  # no argparse private API
        source = (Path(cli.__file__).parent / module).read_text(encoding="utf-8")
        assert "_actions" not in source
        assert "_SubParsersAction" not in source
    assert not hasattr(cli, "MODEL_FLAGS")
    assert not hasattr(cli, "TRAIN_FLAGS")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--peak-flops", "inf", "argument --peak-flops: expected a positive finite number, got 'inf'"),
    ("--threads", "0", "argument --threads: expected a positive integer or auto, got '0'"),
    ("--positional", "spiral", "argument --positional: invalid choice: 'spiral' (choose from learned, sinusoidal, "
                               "rope, alibi)"),
    ("--dropout", "1", "argument --dropout: expected a number in [0, 1), got '1'"),
])
def test_generated_flags_keep_the_one_line_messages(flag: str, value: str, message: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["train", flag, value, "--out", str(tmp_path / "run")]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"typed-transformer train: error: {message.split(' (choose')[0]}")


@pytest.mark.parametrize("command", ["train", "train-seq2seq"])
def test_the_config_help_names_a_key_that_command_accepts(command: str, tmp_path: Path) -> None:
    import re

    from typed_transformer._options import read_config
    from typed_transformer.cli import _command_flags

    (parser,) = [child for name, child in _parsers(build_parser(), "") if name == f" {command}"]
    (action,) = [action for action in parser._actions if "--config" in action.option_strings]
    example = re.search(r"e\.g\. (\w+ = \w+)", action.help or "")
    assert example is not None, action.help
    config = tmp_path / "config.toml"
    config.write_text(example.group(1) + "\n")
    assert read_config(config, _command_flags(command))  # an unknown key would raise ValueError


def test_progress_on_stderr_results_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """train wrote its progress to stderr and train-seq2seq to stdout: one rule for both (docs/training.md)."""
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    runs = {"train": ["train", "--data", str(text), "--max-iters", "6", *TINY, "--eval-interval", "3",
                      "--no-progress"],
            "train-seq2seq": ["train-seq2seq", "--max-iters", "6", "--eval-interval", "3", "--eval-pairs", "4",
                              "--d-model", "16", "--dim-feedforward", "32", "--batch-size", "8", "--no-progress"]}
    for name, argv in runs.items():
        capsys.readouterr()
        assert run([*argv, "--out", str(tmp_path / name)]) == 0
        captured = capsys.readouterr()
        assert re.search(r"^iter +3:", captured.err, re.MULTILINE), name
        assert not re.search(r"^iter ", captured.out, re.MULTILINE), name
        assert captured.out.startswith("done: iteration 6"), name
