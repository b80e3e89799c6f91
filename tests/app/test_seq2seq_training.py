"""The encoder-decoder job: synthetic tasks and pairs files, ``train-seq2seq`` (learning, resuming, checkpoints,
one-line errors) and ``translate``."""

import io
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cli import one_line, run
from typed_transformer.data import DataError
from typed_transformer.seq2seq_data import BOS, EOS, PAD, PairVocab, encode_pairs, make_pairs, read_pairs, split_pairs
from typed_transformer.seq2seq_training import (
    Seq2SeqConfig,
    evaluate_pairs,
    load_seq2seq,
    seq2seq_learning_rate,
    train_seq2seq,
    translate,
)

TINY = ["--d-model", "16", "--nhead", "2", "--layers", "1", "--dim-feedforward", "32", "--batch-size", "16",
        "--eval-pairs", "20", "--max-len", "4", "--no-progress"]


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "add"])
def test_task_pairs_follow_their_definition(task: str) -> None:
    pairs = make_pairs(task, 200, min_len=1, max_len=3, vocab=5, seed=3)
    assert pairs == make_pairs(task, 200, min_len=1, max_len=3, vocab=5, seed=3)
    for source, target in pairs:
        if task == "add":
            a, b = source.split("+")
            assert 1 <= len(a) <= 3
            assert 1 <= len(b) <= 3
            assert int(target) == int(a) + int(b)
            continue
        assert 1 <= len(source) <= 3
        assert set(source) <= set("01234")
        expected = {"copy": source, "reverse": "".join(reversed(source)), "sort": "".join(sorted(source))}[task]
        assert target == expected
    if task != "add":
        assert {len(s) for s, _ in pairs} == {1, 2, 3}


def test_pairs_encode_with_bos_eos_and_padding() -> None:
    vocab = PairVocab("abc")
    src, tgt = encode_pairs(vocab, [("ab", "c"), ("c", "abca")])
    assert src.tolist() == [[3, 4], [5, PAD]]
    assert tgt.tolist() == [[BOS, 5, EOS, PAD, PAD, PAD], [BOS, 3, 4, 5, 3, EOS]]
    assert vocab.decode(tgt[1]) == "abca"
    with pytest.raises(DataError, match="characters not in the vocabulary: 'z'"):
        vocab.encode("az")


@pytest.mark.parametrize(("text", "message"), [
    ("ab\tba\nno tab here\n", "line 2 has 0 tabs"),
    ("ab\tba\na\tb\tc\n", "line 2 has 2 tabs"),
    ("ab\tba\n\tb\n", "line 2 has an empty source"),
    ("ab\tba\n\n\nx\t\n", "line 4 has an empty target"),
    ("ab\tba\n", "1 pair(s)"),
])
def test_bad_pairs_files_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_pairs(path)


@pytest.mark.parametrize("separator", ["\x85", "\x0c", "\x1c", "\x1d", "\x1e", "\u2028", "\u2029", "\x0b", "\r"])
def test_a_pairs_line_ends_at_newline_only(separator: str, tmp_path: Path) -> None:
    """str.splitlines() would split at each of these: two pairs, or a wrong refusal ("line 2 has 0 tabs")."""
    path = tmp_path / "pairs.tsv"
    path.write_bytes(f"a{separator}b\tc\nde\tf{separator}g\r\nhi\tjk".encode())
    assert read_pairs(path) == [(f"a{separator}b", "c"), ("de", f"f{separator}g"), ("hi", "jk")]


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_pair_longer_than_the_longest_sequence_is_refused_naming_its_line(side: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """200,000 characters made one step attend over 200,000 positions (SIGTERM waited for it for minutes)."""
    long = "x" * 200_000
    path = tmp_path / "pairs.tsv"
    path.write_text("ab\tba\n" + (f"{long}\tb\n" if side == "source" else f"a\t{long}\n"), encoding="utf-8")
    assert run(["train-seq2seq", *TINY, "--data", str(path), "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"typed-transformer: error: {path}: line 2's {side} has 200,000 characters; at most 512 per side (the "
        "longest sequence train-seq2seq trains on)")
    path.write_text("ab\tba\n" + "y" * 512 + "\tb\n", encoding="utf-8")
    assert len(read_pairs(path)) == 2  # 512: the bound, inclusive


def test_split_holds_out_a_fraction_and_keeps_every_pair() -> None:
    pairs = [(str(i), str(i)) for i in range(50)]
    train, held = split_pairs(pairs, 0.1, seed=1)
    assert len(held) == 5
    assert sorted(train + held) == sorted(pairs)
    assert split_pairs(pairs, 0.1, seed=1) == (train, held)


def test_evaluation_counts_tokens_and_exact_matches() -> None:
    """A model stub whose greedy output is given: token accuracy and exact match from their definitions."""
    vocab = PairVocab("ab")

    class Stub(torch.nn.Module):
        def greedy_decode(self, src: torch.Tensor, **_: object) -> torch.Tensor:
            return torch.tensor([[BOS, 3, 4, EOS], [BOS, 3, 3, EOS]])

    scores = evaluate_pairs(Stub(), vocab, [("a", "ab"), ("b", "ab")])  # type: ignore[arg-type]
    assert scores == {"token_accuracy": 5 / 6, "exact_match": 0.5}


def test_a_small_task_learns_to_near_perfect_exact_match(tmp_path: Path) -> None:
    """Reverse 1-6 symbols of 6: 400 steps of a 2+2-layer, 32-wide model on one thread reach >= 97% exact
    match on 300 held-out pairs (measured 99-100%, in about 10 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = Seq2SeqConfig(task="reverse", vocab=6, max_len=6, d_model=32, dim_feedforward=64, max_iters=400,
                               eval_interval=400, eval_pairs=300)
        result = train_seq2seq(config, tmp_path / "run", log=io.StringIO())
    finally:
        torch.set_num_threads(threads)
    assert result.history[-1]["exact_match"] >= 0.97
    held = make_pairs("reverse", 50, min_len=1, max_len=6, vocab=6, seed=99)
    got = translate(result.model, result.vocab, [s for s, _ in held])
    assert sum(g == t for g, (_, t) in zip(got, held, strict=True)) >= 45


def test_train_translate_and_resume_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "20", "--eval-interval", "10", "--out", str(out),
                "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    progress, printed = captured.err, captured.out
    assert progress.splitlines()[0].startswith("config: Seq2SeqConfig(")
    assert "max_iters=20" in progress.splitlines()[0]
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["max_iters"] == 20
    assert "iter    10:" in progress
    assert printed.startswith("done: iteration 20")
    straight = load_seq2seq(out)
    assert straight.iteration == 20
    assert [h["iter"] for h in straight.history] == [10, 20]
    # Stop at 10, resume to 20: the same weights as the straight run (batches come from seed and iteration).
    other = tmp_path / "resumed"
    assert run(["train-seq2seq", *TINY, "--max-iters", "10", "--eval-interval", "10", "--out", str(other)]) == 0
    assert run(["train-seq2seq", *TINY, "--max-iters", "20", "--eval-interval", "10", "--out", str(other),
                "--resume"]) == 0
    resumed = load_seq2seq(other)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    capsys.readouterr()
    assert run(["translate", "--checkpoint", str(out), "--text", "0123", "--text", "31", "--beam", "3",
                "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    model = straight.model.eval()
    expected = translate(model, straight.vocab, ["0123", "31"], beam=3)
    assert lines == expected


@pytest.mark.parametrize(("argv", "words"), [
    (["train-seq2seq", "--data", "{bad}"], "line 2 has 0 tabs"),
    (["train-seq2seq", "--data", "{tmp}/none.tsv"], "none.tsv: no such file"),
    (["train-seq2seq", "--d-model", "10", "--nhead", "4"], "not divisible by --nhead 4"),
    (["train-seq2seq", "--min-len", "5", "--max-len", "3"], "need 1 <= min <= max"),
    (["train-seq2seq", "--max-iters", "1", "--out", "{run}"], "exists: continue that run with --resume"),
    (["train-seq2seq", "--max-iters", "3", "--resume", "--vocab", "5", "--out", "{run}"],
     "--vocab is 5 but the checkpoint"),
    (["train-seq2seq", "--resume"], "--resume: no checkpoint in"),
    (["translate", "--checkpoint", "{tmp}/nothing"], "no such checkpoint"),
    (["translate", "--checkpoint", "{corrupt}", "--text", "1"], "integrity check failed"),
    (["translate", "--checkpoint", "{run}", "--text", "1x"], "characters not in the vocabulary"),
    (["translate", "--checkpoint", "{run}", "--text", "1", "--beam", "13"], "--beam must be in [1, 12]"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                             words: str) -> None:
    run_dir = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(run_dir)]) == 0
    bad = tmp_path / "bad.tsv"
    bad.write_text("ab\tba\nnope\n", encoding="utf-8")
    corrupt = tmp_path / "corrupt.safetensors"
    data = bytearray((run_dir / "checkpoint.safetensors").read_bytes())
    data[-1] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    before = (run_dir / "checkpoint.safetensors").read_bytes()
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, bad=bad, corrupt=corrupt, run=run_dir) for a in argv]
    if argv[0] == "train-seq2seq":
        argv = [argv[0], *TINY, "--max-iters", "2", *argv[1:],
                *([] if "--out" in argv else ["--out", str(tmp_path / "fresh")])]
    assert run(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert words in err
    assert (run_dir / "checkpoint.safetensors").read_bytes() == before


def test_translate_reads_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("12\n\n301\n"))
    assert run(["translate", "--checkpoint", str(out)]) == 0
    checkpoint = load_seq2seq(out)
    assert capsys.readouterr().out.splitlines() == translate(checkpoint.model, checkpoint.vocab, ["12", "301"])


def _bytes_stdin(data: bytes) -> Any:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_translate_takes_crlf_lines_and_names_a_byte_that_is_not_utf8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    checkpoint = load_seq2seq(out)
    monkeypatch.setattr("sys.stdin", _bytes_stdin(b"12\r\n\r\n301\r\n"))
    assert run(["translate", "--checkpoint", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == translate(checkpoint.model, checkpoint.vocab, ["12", "301"])
    monkeypatch.setattr("sys.stdin", _bytes_stdin(b"12\n3\xff1\n"))
    assert run(["translate", "--checkpoint", str(out)]) == 2
    assert one_line(capsys.readouterr().err) == ("typed-transformer: error: stdin line 2 is not UTF-8 (byte 0xff at "
                                                 "byte 2 of the line)")


def test_translate_with_stdin_closed_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", None)  # what Python makes of a closed descriptor 0 (`<&-`)
    assert run(["translate", "--checkpoint", str(out)]) == 2
    assert one_line(capsys.readouterr().err) == ("typed-transformer: error: nothing to translate: give --text or "
                                                 "lines on stdin (stdin is closed)")


@pytest.mark.parametrize("where", ["stdin", "--text"])
def test_translate_refuses_a_source_longer_than_the_longest_sequence_naming_its_line(
        where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A source over MAX_PAIR_LENGTH characters (each in the vocabulary) is refused in one line naming it, before
    the encoder runs attention over it."""
    from typed_transformer.seq2seq import Seq2SeqTransformer
    from typed_transformer.seq2seq_data import MAX_PAIR_LENGTH

    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    encoded: list[int] = []
    encode = Seq2SeqTransformer.encode

    def counted(self: Seq2SeqTransformer, src: torch.Tensor) -> torch.Tensor:
        encoded.append(src.shape[1])
        return encode(self, src)

    monkeypatch.setattr(Seq2SeqTransformer, "encode", counted)
    long = "0123456789" * 60 + "0"  # 601 characters
    assert len(long) > MAX_PAIR_LENGTH
    if where == "stdin":
        monkeypatch.setattr("sys.stdin", _bytes_stdin(f"12\n\n{long}\n".encode()))
        argv, named = ["translate", "--checkpoint", str(out)], "stdin line 3"
    else:
        argv, named = ["translate", "--checkpoint", str(out), "--text", "12", "--text", long], "--text 2"
    assert run(argv) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: {named} has 601 characters; at most "
                                                 f"{MAX_PAIR_LENGTH} (the longest sequence train-seq2seq trains on)")
    assert encoded == []
    assert run(["translate", "--checkpoint", str(out), "--text", long[:MAX_PAIR_LENGTH], "--max-new-tokens",
                "2"]) == 0  # the longest one is translated
    assert encoded == [MAX_PAIR_LENGTH]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_stopped_on_an_evaluation_iteration_keeps_that_evaluation(signum: int, tmp_path: Path) -> None:
    """The resumed run starts after the evaluation it would have made: the stopped run makes it."""
    config = Seq2SeqConfig(max_len=4, d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_iters=15,
                           eval_interval=5, eval_pairs=10)

    def stop(iteration: int) -> None:
        if iteration == 10:
            os.kill(os.getpid(), signum)

    straight = train_seq2seq(config, tmp_path / "straight", log=io.StringIO())
    # `nohup` starts the suite with SIGHUP ignored, which the program rightly keeps: the signal's default here
    previous = signal.signal(signum, signal.SIG_DFL)
    try:
        stopped = train_seq2seq(config, tmp_path / "run", on_step=stop, log=io.StringIO())
    finally:
        signal.signal(signum, previous)
    assert (stopped.signal, stopped.iteration) == (signum, 10)
    resumed = train_seq2seq(config, tmp_path / "run", resume=True, log=io.StringIO())
    assert [h["iter"] for h in straight.history] == [5, 10, 15]
    assert resumed.history == straight.history
    assert load_seq2seq(tmp_path / "run").history == straight.history


def test_the_first_signal_saves_and_stops(tmp_path: Path) -> None:
    config = Seq2SeqConfig(max_len=4, d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_iters=50,
                           eval_pairs=10)

    def interrupt(iteration: int) -> None:
        if iteration == 5:
            os.kill(os.getpid(), signal.SIGINT)

    result = train_seq2seq(config, tmp_path / "run", on_step=interrupt, log=io.StringIO())
    assert result.signal == signal.SIGINT
    assert result.iteration == 5
    assert load_seq2seq(tmp_path / "run").iteration == 5


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_finite_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "4", "--eval-interval", "2", "--out", str(out)]) == 0
    before = (out / "checkpoint.safetensors").read_bytes()
    calls = []
    cross_entropy = torch.nn.functional.cross_entropy

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        loss = cross_entropy(*args, **kwargs)
        return loss * float("nan") if len(calls) > 1 else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", poisoned)
    capsys.readouterr()
    assert run(["train-seq2seq", *TINY, "--max-iters", "8", "--eval-interval", "2", "--out", str(out),
                "--resume"]) == 1
    err = capsys.readouterr().err  # the progress (on stderr, as train's), then the error's one line
    errors = [line for line in err.splitlines() if line.startswith("typed-transformer")]
    assert len(errors) == 1
    assert err.splitlines()[-1] == errors[0]
    assert "the loss is nan at iteration 5" in errors[0]
    assert (out / "checkpoint.safetensors").read_bytes() == before


def test_too_little_free_space_is_refused_before_the_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As for the GPT: two checkpoints must fit before training starts; one line, exit 2, the checkpoint kept. The
    size estimate bounds the real file within 64 KiB."""
    import shutil

    from typed_transformer.checkpoint import checkpoint_bytes

    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "4", "--eval-interval", "2", "--out", str(out)]) == 0
    checkpoint = load_seq2seq(out)
    size = (out / "checkpoint.safetensors").stat().st_size
    assert size <= checkpoint_bytes(checkpoint.model, evaluations=len(checkpoint.history)) <= size + 2**16
    before = (out / "checkpoint.safetensors").read_bytes()
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=10_000))
    capsys.readouterr()
    assert run(["train-seq2seq", *TINY, "--max-iters", "8", "--eval-interval", "2", "--out", str(out),
                "--resume"]) == 2
    err = capsys.readouterr().err
    assert "iter " not in err
    assert err.splitlines()[-1].startswith(f"typed-transformer: error: {out}: not enough free space for the run's "
                                           "checkpoints: 9.8 KiB free, ")
    assert (out / "checkpoint.safetensors").read_bytes() == before


@pytest.mark.parametrize(("name", "change", "words"), [
    ("int32 weight", lambda t: t.update({"model.output_projection.weight":
                                         t["model.output_projection.weight"].to(torch.int32)}),
     "weight output_projection.weight is torch.int32, expected torch.float32 (the dtype of src_embedding.weight"),
    ("int64 step", lambda t: t.update({"optim.0.step": t["optim.0.step"].to(torch.int64)}),
     "optimizer tensor 0.step is torch.int64, expected torch.float32 or torch.float64 (Adam's step count"),
    ("negative exp_avg_sq", lambda t: t.update({"optim.1.exp_avg_sq": -t["optim.1.exp_avg_sq"] - 1.0}),
     "optimizer tensor 1.exp_avg_sq holds a negative value"),
    ("a tensor nothing reads", lambda t: t.update({"junk.x": torch.zeros(2)}), "unexpected tensor junk.x"),
    ("an optimizer tensor not listed", lambda t: t.update({"optim.0.junk": torch.zeros(2)}),
     "unexpected tensor optim.0.junk"),
], ids=["int32 weight", "int64 step", "negative exp_avg_sq", "junk tensor", "unlisted optimizer tensor"])
def test_a_re_signed_checkpoint_of_the_wrong_dtype_or_invariant_is_one_line(
        name: str, change: Any, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch's load_state_dict would cast the int32 weight and the int64 step silently."""
    from tests.support.cli import rewrite

    out = tmp_path / "run"
    assert run(["train-seq2seq", *TINY, "--max-iters", "2", "--out", str(out)]) == 0
    path = out / "checkpoint.safetensors"
    rewrite(path, path, lambda tensors, metadata: change(tensors))
    before = path.read_bytes()
    capsys.readouterr()
    for argv in (["translate", "--checkpoint", str(out), "--text", "12"],
                 ["train-seq2seq", *TINY, "--max-iters", "4", "--out", str(out), "--resume"]):
        assert run(argv) == 2
        assert one_line(capsys.readouterr().err).startswith(f"typed-transformer: error: {path}: invalid checkpoint "
                                                            f"({words}")
    assert path.read_bytes() == before


def test_a_config_file_sets_the_run_and_the_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('d-model = 16\nnhead = 2\nlayers = 1\ndim_feedforward = 32\nbatch_size = 16\neval_pairs = 20\n'
                      'max_len = 4\nmax_iters = 2\npost_norm = true\ntask = "copy"\nthreads = "auto"\n'
                      'no_progress = true\nlearning_rate = 0.01\n', encoding="utf-8")
    out = tmp_path / "run"
    assert run(["train-seq2seq", "--config", str(config), "--learning-rate", "0.003", "--out", str(out)]) == 0
    saved = load_seq2seq(out).config
    assert saved == Seq2SeqConfig(task="copy", d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=16,
                                  eval_pairs=20, max_len=4, max_iters=2, norm_first=False, learning_rate=0.003)
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["learning_rate"] == 0.003


@pytest.mark.parametrize(("toml", "message"), [
    ("nheads = 2\n", "unknown key 'nheads' (known: batch_size, d_model, data, dim_feedforward, dropout, "),
    ("nhead = 0\n", "nhead: expected an integer from 1 to 1024, got '0'"),
    ("task = \"shuffle\"\n", "task: expected one of copy, reverse, sort, add, got 'shuffle'"),
    ("post_norm = 1\n", "post_norm: expected true or false, got 1"),
    ("threads = \"many\"\n", "threads: expected an integer, got 'many'"),
    ("resume = true\n", "unknown key 'resume'"),
])
def test_a_bad_config_file_is_one_line(toml: str, message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml, encoding="utf-8")
    assert run(["train-seq2seq", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"typed-transformer: error: --config {config}: {message}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("threads", ["1", "auto"])
def test_threads_fixed_or_timed_on_the_steps(threads: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import typed_transformer.step_loop as step_loop
    from typed_transformer.threads import RunThreads, ThreadChoice, fix_threads

    requested: list[int | str | None] = []
    observed: list[float] = []

    class Schedule(RunThreads):
        def observe(self, seconds: float) -> None:
            observed.append(seconds)
            super().observe(seconds)

    def spy(value: int | str | None) -> Any:
        requested.append(value)
        return ThreadChoice(None, "auto") if value == "auto" else fix_threads(value)  # auto, whatever the suite set

    monkeypatch.setattr(step_loop, "fix_threads", spy)
    monkeypatch.setattr(step_loop, "RunThreads", Schedule)
    before = torch.get_num_threads()
    try:
        assert run(["train-seq2seq", *TINY, "--max-iters", "6", "--threads", threads,
                    "--out", str(tmp_path / "run")]) == 0
        assert requested == [1 if threads == "1" else "auto"]
        if threads == "1":
            assert torch.get_num_threads() == 1
            assert observed == []
        else:  # the tuner sees every step (the step loop's, as train's)
            assert len(observed) == 6
            assert all(seconds > 0 for seconds in observed)
    finally:
        torch.set_num_threads(before)


def test_threads_must_be_auto_or_a_positive_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["train-seq2seq", "--threads", "0", "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err) == ("typed-transformer train-seq2seq: error: argument --threads: "
                                                 "expected a positive integer or auto, got '0'")


def test_training_goes_through_the_step_loop_and_equals_a_plain_loop(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder-decoder trains on the step loop that trains the GPT (one step path), and its weights equal
    those of a plain teacher-forcing loop written here: Adam(0.9, 0.98), the warmup + cosine rate, batches and
    dropout from (seed, iteration)."""
    from typed_transformer import seq2seq_training
    from typed_transformer.step_loop import StepLoop

    config = Seq2SeqConfig(max_len=4, d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_iters=12,
                           eval_pairs=10, eval_interval=5, dropout=0.1)
    steps: list[str] = []
    step = StepLoop.step

    def counted(self: StepLoop[Any], interrupt: Any) -> float:
        steps.append(type(self).__name__)
        return step(self, interrupt)

    monkeypatch.setattr(StepLoop, "step", counted)
    result = train_seq2seq(config, tmp_path / "run", log=io.StringIO(), threads=1)
    assert steps == ["Seq2SeqTrainer"] * 12
    assert [h["iter"] for h in result.history] == [5, 10, 12]

    vocab, _, _, _ = seq2seq_training._data(config)
    torch.manual_seed(config.seed)
    model = seq2seq_training.build_model(config, vocab).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), eps=1e-9)
    for iteration in range(config.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = seq2seq_training.seq2seq_learning_rate(config, iteration)
        torch.manual_seed(config.seed * 1_000_003 + iteration)
        src, tgt = encode_pairs(vocab, make_pairs("reverse", config.batch_size, min_len=1, max_len=4, vocab=10,
                                                  seed=config.seed * 1_000_003 + iteration))
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    for (name, a), b in zip(model.state_dict().items(), result.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_config_json_replaces_a_symbolic_link_instead_of_following_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("not yours\n", encoding="utf-8")
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").symlink_to(outside)
    assert run(["train-seq2seq", *TINY, "--max-iters", "1", "--out", str(out)]) == 0
    assert outside.read_text(encoding="utf-8") == "not yours\n"
    assert not (out / "config.json").is_symlink()
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["max_iters"] == 1


def test_resume_refuses_an_edited_data_file_with_the_same_characters(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{a}{b}\t{b}{a}\n" for a in "abc" for b in "abc"), encoding="utf-8")
    out = tmp_path / "run"
    flags = [*TINY, "--data", str(data), "--out", str(out), "--eval-interval", "1"]
    assert run(["train-seq2seq", *flags, "--max-iters", "1"]) == 0
    assert load_seq2seq(out).data_sha256 is not None
    data.write_text(data.read_text(encoding="utf-8").replace("ab\tba", "ab\tab"), encoding="utf-8")
    before = (out / "checkpoint.safetensors").read_bytes()
    capsys.readouterr()
    assert run(["train-seq2seq", *flags, "--max-iters", "2", "--resume"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"typed-transformer: error: --resume: {data} is not the data the checkpoint was trained on (the sha256 of "
        "its pairs differs: the file was edited)")
    assert (out / "checkpoint.safetensors").read_bytes() == before
    data.write_text(data.read_text(encoding="utf-8").replace("ab\tab", "ab\tba").replace("\n", "\r\n"),
                    encoding="utf-8")  # the same pairs, other line endings: resumes
    assert run(["train-seq2seq", *flags, "--max-iters", "2", "--resume"]) == 0


def _seq2seq_rate(peak: float, warmup: int, total: int, it: int) -> float:
    """The encoder-decoder's schedule, written out here: warmup ``peak (it + 1) / warmup``, then cosine from the
    peak to a tenth of it at ``total``, a tenth after."""
    if it < warmup:
        return peak * (it + 1) / warmup
    progress = min(1.0, (it - warmup) / (total - warmup))
    return peak / 10 + (peak - peak / 10) * (1 + math.cos(math.pi * progress)) / 2


#: seq2seq_learning_rate's values of Seq2SeqConfig(max_iters=100, warmup_iters=10, learning_rate=2e-3), to the
#: bit: warm-up, the first step after it, the middle, the end, past it.
SEQ2SEQ_RATES = {0: 0.0002, 5: 0.0012000000000000001, 9: 0.002, 10: 0.002, 55: 0.0011, 100: 0.0002, 150: 0.0002}


def test_the_seq2seq_schedule_is_its_formula_at_each_phase() -> None:
    config = Seq2SeqConfig(max_iters=100, warmup_iters=10, learning_rate=2e-3)
    for it, pinned in SEQ2SEQ_RATES.items():
        assert seq2seq_learning_rate(config, it) == pinned, it
        assert math.isclose(seq2seq_learning_rate(config, it), _seq2seq_rate(2e-3, 10, 100, it), rel_tol=1e-12), it
    assert seq2seq_learning_rate(config, 9) == 2e-3  # warm-up reaches the peak: (it + 1) / warmup


def test_the_two_schedules_differ_in_the_warm_up_alone() -> None:
    """At the same peak, warm-up and length, with the GPT's floor at a tenth of the peak (the seq2seq's): the
    warm-ups differ (``/ (warmup + 1)`` against ``/ warmup``), the cosines and the floors agree."""
    from typed_transformer.training import TrainConfig, gpt_learning_rate

    gpt = TrainConfig(max_iters=100, warmup_iters=10, learning_rate=2e-3, min_lr=2e-4)
    seq2seq = Seq2SeqConfig(max_iters=100, warmup_iters=10, learning_rate=2e-3)
    for it in range(10):
        assert gpt_learning_rate(gpt, it) < seq2seq_learning_rate(seq2seq, it), it
        assert gpt_learning_rate(gpt, it) * 11 == pytest.approx(seq2seq_learning_rate(seq2seq, it) * 10, rel=1e-12)
    for it in (10, 30, 55, 99, 100, 101, 150):
        assert math.isclose(gpt_learning_rate(gpt, it), seq2seq_learning_rate(seq2seq, it), rel_tol=1e-12), it


# --- what a newcomer hit with --data (issue 43 item 4) ------------------------------------------------------------


@pytest.mark.parametrize("header", ["source\ttarget", "Source\tTarget", "src\ttgt", "input\toutput"])
def test_a_header_line_is_refused_not_trained_on(tmp_path: Path, header: str) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text(f"{header}\nabc\tcba\nxy\tyx\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 1 is a header \(.*\), which would be trained on as a pair"):
        read_pairs(path)
    path.write_text("abc\tcba\nsource\ttarget\nxy\tyx\n", encoding="utf-8")  # not first: data, as any line
    assert ("source", "target") in read_pairs(path)


def test_a_run_on_data_does_not_print_the_synthetic_tasks_settings() -> None:
    from typed_transformer.seq2seq_training import describe_config

    on_data = describe_config(Seq2SeqConfig(task=None, data="pairs.tsv"))
    assert on_data.startswith("Seq2SeqConfig(data='pairs.tsv', held_out=")
    for name in ("task=", "vocab=", "min_len=", "max_len=", "eval_pairs="):
        assert name not in on_data
    assert describe_config(Seq2SeqConfig()) == repr(Seq2SeqConfig())  # a task's run prints them all


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
@pytest.mark.parametrize("command", [["train-seq2seq", "--max-iters", "1"], ["translate", "--text", "12"]])
def test_device_cuda_without_cuda_is_one_line_before_any_work(command: list[str], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--out", str(tmp_path / "run")] if command[0] == "train-seq2seq" else ["--checkpoint", str(tmp_path)]
    assert run([*command, *where, "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "typed-transformer: error: --device cuda: no CUDA device is available"]
    assert not (tmp_path / "run").exists()
