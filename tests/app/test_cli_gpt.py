"""The ``train`` and ``generate`` commands: a tiny run, resumption, generation, and one-line errors."""

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.support.cli import TEXT, run, train_run
from typed_transformer.checkpoint import CHECKPOINT_NAME, load_checkpoint
from typed_transformer.cli import main

TINY = ["--block-size", "8", "--eval-interval", "10", "--eval-iters", "2", "--batch-size", "4",
        "--sample-tokens", "20", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(text file, run directory) of one 20-iteration run, shared by the tests that only read it."""
    return train_run(tmp_path_factory.mktemp("cli"), 20, TINY)


def test_train_writes_a_checkpoint_and_a_plot(trained: tuple[Path, Path]) -> None:
    text, out = trained
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
    assert checkpoint.iteration == 20
    assert checkpoint.model.config.block_size == 8
    assert checkpoint.model.config.n_layer == 4  # the baby preset
    assert checkpoint.model.config.n_embd == 128
    assert checkpoint.tokenizer.chars == "".join(sorted(set(TEXT)))
    assert [h["iter"] for h in checkpoint.history] == [0, 10, 20]
    # The thread count in use at the save, and who set it (the suite fixes it through OMP_NUM_THREADS).
    assert checkpoint.info.pop("threads").endswith(" (OMP_NUM_THREADS)")
    assert checkpoint.info == {"source": str(text), "text_chars": len(TEXT), "preset": "baby",
                               "text_sha256": hashlib.sha256(TEXT.encode()).hexdigest()}
    assert checkpoint.train_config["max_iters"] == 20
    assert checkpoint.train_config["batch_size"] == 4
    assert (checkpoint.train_config["learning_rate"], checkpoint.train_config["min_lr"]) == (3e-3, 3e-4)  # baby's


def test_train_prints_the_summary_and_a_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    argv = ["train", "--data", str(text), "--max-iters", "3", *TINY, "--eval-interval", "3", "--out",
            str(tmp_path / "r")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("done: iteration 3, train loss ")
    sample = captured.out.split("sample:\n", 1)[1]
    assert len(sample) == 20 + 1
    assert set(sample[:-1]) <= set(TEXT)
    assert f"data: {text}: {len(TEXT):,} characters" in captured.err
    assert "Traceback" not in captured.err


def test_resume_continues_the_run(trained: tuple[Path, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    text, original = trained
    out = tmp_path / "run"
    shutil.copytree(original, out)
    before = load_checkpoint(out)
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--resume", "--max-iters", "30", *TINY, "--out", str(out)]) == 0
    assert f"resuming {out / CHECKPOINT_NAME} at iteration 20" in capsys.readouterr().err
    after = load_checkpoint(out)
    assert after.iteration == 30
    assert [h["iter"] for h in after.history] == [0, 10, 20, 30]
    assert after.history[:3] == before.history
    assert after.tokenizer == before.tokenizer
    assert not torch.equal(after.model.tok_emb.weight, before.model.tok_emb.weight)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--max-iters", "30", "--block-size", "16"], "--block-size 16 differs from the checkpoint's 8"),
        (["--max-iters", "30", "--positional", "rope"], "--positional rope differs from the checkpoint's learned"),
        # Fails today: the "resuming ... at iteration 20" line is printed before this error (two lines).
        (["--max-iters", "20"], "the checkpoint is already at iteration 20; pass a larger --max-iters"),
    ],
)
def test_resume_refuses_a_changed_model_or_no_more_iterations(
    extra: list[str], words: str, trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, original = trained
    out = tmp_path / "run"
    shutil.copytree(original, out)
    argv = ["train", "--data", str(text), "--resume", *TINY, *extra, "--out", str(out)]
    # TINY sets --block-size 8; a later --block-size overrides it.
    capsys.readouterr()
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, f"expected one line on stderr, got:\n{err}"
    assert err.startswith("typed-transformer: error: ")
    assert words in err
    assert load_checkpoint(out).iteration == 20  # untouched


def test_resume_refuses_a_different_text(trained: tuple[Path, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _, original = trained
    out = tmp_path / "run"
    shutil.copytree(original, out)
    other = tmp_path / "other.txt"
    other.write_text(TEXT + "more", encoding="utf-8")
    capsys.readouterr()
    assert run(["train", "--data", str(other), "--resume", "--max-iters", "30", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "is not the text the checkpoint was trained on" in err


def test_generate_continues_the_prompt(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out = trained
    capsys.readouterr()
    argv = ["generate", "--checkpoint", str(out), "--prompt", "speak", "--max-new-tokens", "25", "--seed", "7"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("speak")
    assert printed.endswith("\n")
    assert len(printed) == len("speak") + 25 + 1
    assert set(printed) <= set(TEXT)
    assert main(argv) == 0
    assert capsys.readouterr().out == printed  # same seed, same text


def test_generate_streams_the_text_and_ctrl_c_keeps_what_was_printed(
        trained: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """generate printed nothing until it had finished, and Ctrl-C exited 130 with nothing printed."""
    import typed_transformer.gpt as gpt
    from typed_transformer.generation import continue_prompts

    _, out = trained
    argv = ["generate", "--checkpoint", str(out), "--prompt", "speak", "--max-new-tokens", "25", "--seed", "7",
            "--threads", "1"]
    checkpoint = load_checkpoint(out)
    (whole,) = continue_prompts(checkpoint.model.eval(), checkpoint.tokenizer, ["speak"], 25, seed=7,
                                temperature=0.8)
    real = gpt.sample
    draws: list[str] = []

    def sample_then_ctrl_c(*args: object, **kwargs: object) -> torch.Tensor:
        if len(draws) == 10:
            raise KeyboardInterrupt
        draws.append(capsys.readouterr().out)  # what the user sees before each draw
        return real(*args, **kwargs)  # type: ignore[arg-type]

    capsys.readouterr()
    monkeypatch.setattr(gpt, "sample", sample_then_ctrl_c)
    assert main(argv) == 130
    captured = capsys.readouterr()
    shown = "".join([*draws, captured.out])
    assert [len(text) for text in draws] == [5] + [1] * 9  # the prompt, then each character as it is drawn
    assert shown == whole[:len("speak") + 10] + "\n"  # the same text as without streaming, up to Ctrl-C
    assert captured.err == "typed-transformer: interrupted (Ctrl-C)\n"
    monkeypatch.setattr(gpt, "sample", real)
    assert main(argv) == 0
    assert capsys.readouterr().out == whole + "\n"


def test_several_prompts_each_continue_as_they_would_alone(trained: tuple[Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    _, out = trained
    flags = ["--checkpoint", str(out), "--max-new-tokens", "20", "--seed", "7"]
    alone = []
    for prompt in ("speak", "all:", "a"):
        capsys.readouterr()
        assert main(["generate", *flags, "--prompt", prompt]) == 0
        alone.append(capsys.readouterr().out)
    expected = "".join(f"==> prompt {i} <==\n{text}" for i, text in enumerate(alone, 1))
    assert main(["generate", *flags, "--prompt", "speak", "--prompt", "all:", "--prompt", "a"]) == 0
    assert capsys.readouterr().out == expected
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("all:\n\na\n", encoding="utf-8")
    assert main(["generate", *flags, "--prompt", "speak", "--prompts-file", str(prompts)]) == 0
    assert capsys.readouterr().out == expected


def test_greedy_generate_matches_the_model(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out = trained
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out / CHECKPOINT_NAME), "--prompt", "all:", "--greedy",
                 "--max-new-tokens", "12"]) == 0
    checkpoint = load_checkpoint(out)
    model = checkpoint.model.eval()
    ids = torch.tensor([checkpoint.tokenizer.encode("all:")])
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(ids[:, -8:], all_positions=True)
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert capsys.readouterr().out == checkpoint.tokenizer.decode(ids[0]) + "\n"


def test_an_alibi_run_trains_resumes_and_generates_with_the_cache(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--positional alibi through the commands: the checkpoint keeps the choice (the slopes are rebuilt, not
    saved), a resumed run goes on, and greedy generation past the context (the KV cache, then recomputed
    windows) prints what recomputing the whole window at every step gives."""
    text, out = train_run(tmp_path, 4, [*TINY, "--positional", "alibi", "--eval-interval", "2"])
    assert main(["train", "--data", str(text), "--resume", "--max-iters", "6", *TINY, "--eval-interval", "2",
                 "--out", str(out)]) == 0
    checkpoint = load_checkpoint(out)
    assert (checkpoint.iteration, checkpoint.model.config.positional) == (6, "alibi")
    assert checkpoint.history[-1]["train"] < checkpoint.history[0]["train"]
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--prompt", "all:", "--greedy", "--max-new-tokens",
                 "12"]) == 0
    model = checkpoint.model.eval()
    ids = torch.tensor([checkpoint.tokenizer.encode("all:")])
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(ids[:, -8:], all_positions=True)
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert capsys.readouterr().out == checkpoint.tokenizer.decode(ids[0]) + "\n"


# ---------------------------------------------------------------------------------------------------
# Bad inputs: one line on stderr, exit code 2
# ---------------------------------------------------------------------------------------------------


def _write(name: str, content: bytes) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        path = root / name
        path.write_bytes(content)
        return path

    return make


BAD_DATA: list[tuple[Callable[[Path], Path], str]] = [
    (lambda root: root / "missing.txt", "no such file"),
    (lambda root: root, "is a directory"),
    (_write("binary.bin", b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20), "binary file"),
    (_write("latin1.txt", ("caf\xe9 " * 50).encode("latin-1")), "is not UTF-8 text"),
    (_write("empty.txt", b""), "is empty"),
    (_write("short.txt", b"abcdefgh"), "is too short for block_size=8"),
]


@pytest.mark.parametrize(("make", "words"), BAD_DATA)
def test_bad_training_data(make: Callable[[Path], Path], words: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    data = make(tmp_path)
    code = run(["train", "--data", str(data), "--max-iters", "2", *TINY, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(f"typed-transformer: error: {data}")
    assert words in err
    assert not (tmp_path / "out" / CHECKPOINT_NAME).exists()


def _corrupt_checkpoint(root: Path) -> Path:
    path = root / "corrupt.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + b"\x00" * 8)
    return path


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["generate", "--checkpoint", "{run}", "--prompt", "speak \u2603"], "characters not in the vocabulary"),
        (["generate", "--checkpoint", "{tmp}/nothing.safetensors"], "no such checkpoint"),
        (["generate", "--checkpoint", "{tmp}"], "no such checkpoint"),
        (["generate", "--checkpoint", "{corrupt}"], "not a readable checkpoint"),
        (["generate", "--checkpoint", "{run}", "--prompt", ""], "--prompt is empty"),
        (["generate", "--checkpoint", "{run}", "--prompt", "a", "--prompt", ""], "--prompt is empty (prompt 2)"),
        (["generate", "--checkpoint", "{run}", "--prompts-file", "{tmp}/none.txt"], "none.txt: no such file"),
        (["generate", "--checkpoint", "{run}", "--temperature", "-0.5"], "argument --temperature"),
        (["generate", "--checkpoint", "{run}", "--temperature=-1"], "argument --temperature"),
        (["generate", "--checkpoint", "{run}", "--temperature", "0"], "argument --temperature"),
        (["generate", "--checkpoint", "{run}", "--top-k", "0"], "argument --top-k"),
        (["generate", "--checkpoint", "{run}", "--top-p", "1.5"], "argument --top-p"),
        (["generate", "--checkpoint", "{run}", "--top-p", "0"], "argument --top-p"),
        (["generate", "--checkpoint", "{run}", "--max-new-tokens", "-3"], "argument --max-new-tokens"),
        (["generate"], "--checkpoint"),
        (["train", "--data", "{text}", "--max-iters", "0"], "argument --max-iters"),
        (["train", "--data", "{text}", "--batch-size", "x"], "argument --batch-size"),
        (["train", "--data", "{text}", "--dropout", "1"], "argument --dropout"),
        (["train", "--data", "{text}", "--preset", "huge"], "argument --preset"),
        (["train", "--resume", "--data", "{text}", "--out", "{tmp}/empty-run"], "no such checkpoint"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_code_2(argv: list[str], words: str, trained: tuple[Path, Path],
                                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, out = trained
    places = {"run": str(out), "tmp": str(tmp_path), "text": str(text), "corrupt": str(_corrupt_checkpoint(tmp_path))}
    filled = [arg.format(**places) for arg in argv]
    capsys.readouterr()
    code = run(filled)
    captured = capsys.readouterr()
    assert code == 2
    assert len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith("typed-transformer")
    assert "error: " in captured.err
    assert words in captured.err
    assert captured.out == ""
