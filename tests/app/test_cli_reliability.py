"""The ``train``/``generate`` command line under bad input and signals (issue 13): numeric flag ranges, resume
refusals, Ctrl-C and SIGTERM anywhere (one line, 130/143), the ``[train]`` extra, and what ``import
typed_transformer`` loads."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cli import TEXT, one_line, rewrite, run, train_run
from tests.support.limits import HANG_SECONDS
from typed_transformer._install import install_hint
from typed_transformer.checkpoint import CHECKPOINT_NAME, load_checkpoint
from typed_transformer.cli import main

# AdamW (not the baby preset's Muon): the corrupt-checkpoint cases tamper with Adam's state (Muon's momentum
# buffers: test_muon.py::test_a_muon_checkpoint_with_a_bad_momentum_buffer_is_refused).
TINY = ["--block-size", "8", "--eval-interval", "5", "--eval-iters", "2", "--batch-size", "4", "--sample-tokens", "5",
        "--no-progress", "--optimizer", "adamw"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return train_run(tmp_path_factory.mktemp("reliability"), 10, TINY)


@pytest.fixture
def sigint_as_in_a_terminal() -> Iterator[None]:
    """Ctrl-C raising KeyboardInterrupt and a hang-up terminating, as in a terminal, whatever dispositions the suite
    was started with (``nohup ... &`` starts it with SIGINT and SIGHUP ignored, which the program rightly keeps)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous_hup)
    signal.signal(signal.SIGINT, previous)


def _default_sigint() -> None:
    """``preexec_fn`` of a child that must get SIGINT's default disposition (not an inherited "ignore")."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def copy(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    text, out = trained
    shutil.copytree(out, tmp_path / "run")
    return text, tmp_path / "run"


# ---------------------------------------------------------------------------------------------------
# Numeric flag ranges
# ---------------------------------------------------------------------------------------------------

TRAIN = ["train", "--data", "{text}", "--out", "{tmp}/out"]
GENERATE = ["generate", "--checkpoint", "{run}"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*TRAIN, "--lr", "inf"], "argument --lr: expected a learning rate in (0, 1], got 'inf'"),
        ([*TRAIN, "--lr", "nan"], "argument --lr: expected a learning rate in (0, 1], got 'nan'"),
        ([*TRAIN, "--lr", "1e30"], "argument --lr: expected a learning rate in (0, 1], got '1e30'"),
        ([*TRAIN, "--lr", "0"], "argument --lr: expected a learning rate in (0, 1], got '0'"),
        ([*TRAIN, "--lr", "fast"], "argument --lr: expected a number, got 'fast'"),
        ([*TRAIN, "--batch-size", "1000000000"],
         "argument --batch-size: expected an integer from 1 to 4096, got '1000000000'"),
        ([*TRAIN, "--eval-iters", "1000000000"],
         "argument --eval-iters: expected an integer from 1 to 1000, got '1000000000'"),
        ([*TRAIN, "--block-size", "100000"], "argument --block-size: expected an integer from 1 to 8192, got '100000'"),
        ([*TRAIN, "--seed", "18446744073709551616"],
         "argument --seed: expected an integer from 0 to 4294967295, got '18446744073709551616'"),
        ([*TRAIN, "--seed", "-1"], "argument --seed: expected an integer from 0 to 4294967295, got '-1'"),
        ([*TRAIN, "--max-iters", "0"], "argument --max-iters: expected an integer from 1 to 1000000000, got '0'"),
        ([*TRAIN, "--checkpoint-interval", "0"],
         "argument --checkpoint-interval: expected an integer from 1 to 1000000000, got '0'"),
        ([*TRAIN, "--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
        ([*GENERATE, "--temperature", "1e-300"],
         "argument --temperature: expected a temperature from 0.01 to 100, got '1e-300'"),
        ([*GENERATE, "--temperature", "inf"],
         "argument --temperature: expected a temperature from 0.01 to 100, got 'inf'"),
        ([*GENERATE, "--seed", "18446744073709551616"],
         "argument --seed: expected an integer from 0 to 4294967295, got '18446744073709551616'"),
        ([*GENERATE, "--max-new-tokens", "10000000"],
         "argument --max-new-tokens: expected an integer from 0 to 1000000, got '10000000'"),
    ],
)
def test_numeric_flags_out_of_range(argv: list[str], message: str, trained: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    text, out = trained
    filled = [a.format(text=text, tmp=tmp_path, run=out) for a in argv]
    capsys.readouterr()
    assert run(filled) == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"typed-transformer {filled[0]}: error: {message}"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "4096", "--block-size", "8192"],
         "--batch-size 4096 x block size 8192 = 33,554,432 tokens per step, more than 262,144; lower --batch-size or "
         "--block-size"),
        (["--batch-size", "4096", "--eval-iters", "1000"],  # baby's block size 64
         "--eval-iters 1000 x 262,144 tokens per batch = 262,144,000 evaluation tokens held in memory, more than "
         "16,777,216; lower --eval-iters or --batch-size"),
    ],
)
def test_sizes_that_cannot_fit_together(flags: list[str], message: str, trained: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    text, _ = trained
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *flags]) == 2
    assert one_line(capsys.readouterr().err) == f"typed-transformer: error: {message}"


def test_bounds_are_inclusive(trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out = trained
    assert main([*[a.format(run=out) for a in GENERATE], "--temperature", "0.01", "--seed", "4294967295",
                 "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out) == 1 + 3 + 1  # the default prompt, 3 characters, a newline


# ---------------------------------------------------------------------------------------------------
# Resume: what may change and what may not
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "make_text", "words"),
    [
        (["--preset", "seed"], None, "--preset seed differs from the checkpoint's model (baby: n_layer=4, n_head=4, "
                                     "n_embd=128); a resumed run keeps its model"),
        (["--seed", "7"], None, "--seed 7 differs from the checkpoint's 1337; a resumed run continues the saved "
                                "random state"),
        ([], lambda: TEXT[::-1], "is not the text the checkpoint was trained on (its sha256 differs from that of"),
        ([], lambda: TEXT + "x", "is not the text the checkpoint was trained on (its length differs from that of"),
    ],
)
def test_resume_refuses_another_model_seed_or_text(extra: list[str], make_text: Any, words: str,
                                                   copy: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text, out = copy
    if make_text is not None:
        text = tmp_path / "other.txt"
        text.write_text(make_text(), encoding="utf-8")
    before = (out / CHECKPOINT_NAME).read_bytes()
    capsys.readouterr()
    assert run(["train", "--data", str(text), "--resume", "--max-iters", "20", *TINY, *extra, "--out",
                str(out)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("typed-transformer: error: ")
    assert words in line
    assert (out / CHECKPOINT_NAME).read_bytes() == before


def test_resume_accepts_the_same_preset_and_the_changeable_options(copy: tuple[Path, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text, out = copy
    capsys.readouterr()
    argv = ["train", "--data", str(text), "--resume", "--preset", "baby", "--max-iters", "12", *TINY, "--lr", "1e-3",
            "--batch-size", "3", "--eval-iters", "1", "--checkpoint-interval", "7", "--seed", "1337", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "model: baby preset" in err
    # max_iters 10 -> 12 without lr_decay_iters: the schedule is stretched, and the command says so. (AdamW's
    # warm-up of 100 of 2000 iterations scales to 1 of 10 and 1 of 12: at iteration 10 the new schedule, with the
    # new --lr, is at 1e-4 + 0.5 (1 + cos(pi 9/11)) 9e-4; the old one has reached its minimum, 3e-4.)
    assert ("note: the learning rate now decays over 12 iterations instead of 10: 0.000171 at iteration 10 (the "
            "shorter schedule had 0.0003); see docs/reliability.md") in err
    saved = load_checkpoint(out)
    assert saved.iteration == 12
    assert (saved.train_config["learning_rate"], saved.train_config["batch_size"]) == (1e-3, 3)
    assert saved.train_config["checkpoint_interval"] == 7


def test_resume_with_the_preset_name_alone(copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    text, out = copy  # trained with --block-size 8; --preset baby alone (block 64) still names the same model
    argv = ["train", "--data", str(text), "--resume", "--preset", "baby", "--max-iters", "11", "--no-progress",
            "--sample-tokens", "0", "--out", str(out)]
    assert main(argv) == 0
    assert load_checkpoint(out).iteration == 11


def test_the_documented_resume_list_is_the_code_s() -> None:
    from typed_transformer.cli import CHANGEABLE_ON_RESUME

    page = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text(encoding="utf-8")
    row = next(line for line in page.splitlines() if line.startswith("| `--max-iters`"))
    may_change = row.split(" | ")[0].removeprefix("| ")
    assert may_change == ", ".join(f"`{flag}`" for flag in CHANGEABLE_ON_RESUME)


def test_eval_interval_no_longer_sets_the_checkpoint_interval(trained: tuple[Path, Path], tmp_path: Path) -> None:
    text, _ = trained
    base = ["train", "--data", str(text), "--max-iters", "2", *TINY]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert load_checkpoint(tmp_path / "a").train_config["checkpoint_interval"] == 250
    assert main([*base, "--checkpoint-interval", "3", "--out", str(tmp_path / "b")]) == 0
    assert load_checkpoint(tmp_path / "b").train_config["checkpoint_interval"] == 3


# ---------------------------------------------------------------------------------------------------
# Signals: one line, 130 for Ctrl-C, 143 for SIGTERM, never a traceback
# ---------------------------------------------------------------------------------------------------


def _raise(exception: BaseException) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exception

    return fail


@pytest.mark.parametrize(("signum", "code", "line"), [(signal.SIGINT, 130, "typed-transformer: interrupted (Ctrl-C)"),
                                                      (signal.SIGTERM, 143, "typed-transformer: terminated (SIGTERM)"),
                                                      (signal.SIGHUP, 129, "typed-transformer: terminated (SIGHUP)")])
@pytest.mark.parametrize("where", ["before the loop", "in the end-of-run sample", "in generate", "loading"])
@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_a_signal_anywhere_is_one_line(where: str, signum: int, code: int, line: str, trained: tuple[Path, Path],
                                       tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    text, out = trained
    target = {"before the loop": "typed_transformer.data.TextData.from_text",
              "in the end-of-run sample": "typed_transformer.gpt.GPT.generate",
              "in generate": "typed_transformer.gpt.GPT.stream",  # one prompt: shown as it is sampled
              "loading": "typed_transformer.checkpoint.load_checkpoint"}[where]
    monkeypatch.setattr(target, _raise(RuntimeError("not reached")))

    def deliver(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)  # the real signal, through the real handlers
        time.sleep(1)
        raise AssertionError("the signal did not interrupt")

    monkeypatch.setattr(target, deliver)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    if where == "in generate" or where == "loading":
        argv = ["generate", "--checkpoint", str(out), "--max-new-tokens", "5"]
    else:
        argv = ["train", "--data", str(text), "--max-iters", "2", *TINY, "--out", str(tmp_path / "run")]
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == line
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored
    if where == "in the end-of-run sample":
        assert load_checkpoint(tmp_path / "run").iteration == 2  # saved before the sample


@pytest.mark.usefixtures("sigint_as_in_a_terminal")
def test_a_second_ctrl_c_stops_at_once_without_saving(copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    text, out = copy
    before = (out / CHECKPOINT_NAME).read_bytes()
    import typed_transformer.training as training

    real: Any = getattr(training, "get_batch")  # noqa: B009 (not in __all__)
    calls = []

    def get_batch(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args)

    monkeypatch.setattr(training, "get_batch", get_batch)
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--resume", "--max-iters", "20", *TINY, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == "typed-transformer: interrupted (Ctrl-C)"
    assert (out / CHECKPOINT_NAME).read_bytes() == before
    assert [p.name for p in out.iterdir() if ".tmp" in p.name] == []


LAUNCHER = [sys.executable, "-c", "import sys, typed_transformer_launcher; sys.exit(typed_transformer_launcher.main())"]


@pytest.mark.parametrize(("signum", "code", "line"), [(signal.SIGINT, 130, "typed-transformer: interrupted (Ctrl-C)"),
                                                      (signal.SIGTERM, 143, "typed-transformer: terminated (SIGTERM)")])
def test_a_signal_while_importing_is_one_line(signum: int, code: int, line: str) -> None:
    # torch takes over a second to import; the launcher catches the signal around that import.
    process = subprocess.Popen([*LAUNCHER, "generate", "--checkpoint", "nowhere"], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONWARNINGS": "ignore"}, preexec_fn=_default_sigint)
    # Wait until the launcher catches SIGTERM (its first statement), however slow the interpreter starts.
    status = Path(f"/proc/{process.pid}/status")
    deadline = time.monotonic() + HANG_SECONDS
    while not int(next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:")).split()[1],
                  16) >> (signal.SIGTERM - 1) & 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(signum)
    _, err = process.communicate(timeout=HANG_SECONDS)
    assert process.returncode == code, err
    assert err == line + "\n"


#: A command stuck in one torch kernel, which never looks for signals (as attention over 200,000 positions was).
#: "ready" is printed only once the main thread has been inside the kernel for a while (a signal sent before the
#: kernel starts is taken by Python's handlers between two bytecodes: the ordinary one line, not the watchdog's).
STUCK = """
import sys, threading, time
import typed_transformer.cli as cli
entering = threading.Event()
def say_ready():
    entering.wait()
    time.sleep(0.5)  # the main thread needs microseconds from the event to the kernel
    print("ready", flush=True)
def stuck(args):
    import torch
    ones = torch.ones(1).expand(2**50)
    threading.Thread(target=say_ready, daemon=True).start()
    entering.set()
    return float(ones.sum())  # hours in one kernel (which releases the GIL): Python's handlers wait for it
cli._run_training_command = stuck
sys.exit(cli.main(["generate", "--checkpoint", "x"]))
"""


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGINT, "interrupted (Ctrl-C)"),
                                              (signal.SIGTERM, "terminated (SIGTERM)"),
                                              (signal.SIGHUP, "terminated (SIGHUP)")])
def test_a_signal_is_answered_inside_one_long_c_call(signum: int, said: str) -> None:
    """Without the watchdog the process runs on for hours; with it, it ends GRACE_SECONDS after the signal (the
    limit below only bounds a broken run: it is not the behaviour tested)."""
    process = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=_default_signals)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signum)
        _, err = process.communicate(timeout=HANG_SECONDS)
    finally:
        process.kill()
    assert process.returncode == 128 + signum
    assert one_line(err) == (f"typed-transformer: {said}: the computation under way did not give way within 5 s; "
                             "stopped without saving (the last checkpoint on disk is whole)")


# ---------------------------------------------------------------------------------------------------
# Package boundaries: the [train] extra
# ---------------------------------------------------------------------------------------------------


EXTRA = ("matplotlib", "tqdm", "safetensors")


def test_importing_the_library_loads_no_training_dependency() -> None:
    # torch.hub imports tqdm by itself when it is installed, so count what typed_transformer adds to torch.
    code = (f"import sys, torch\nbefore = set(sys.modules)\nimport typed_transformer\n"
            f"print(sorted(m for m in {EXTRA} if m in sys.modules and m not in before))\n"
            f"print(sorted(m for m in {EXTRA} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=HANG_SECONDS)
    added, loaded = result.stdout.splitlines()
    assert added == "[]"
    assert loaded in ("[]", "['tqdm']")  # tqdm only through torch.hub


def test_the_library_works_without_the_extra() -> None:
    # A core install: the [train] extra's modules cannot be imported at all.
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {EXTRA}: raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import torch, typed_transformer\n"
            "model = typed_transformer.GPT(typed_transformer.GPTConfig(vocab_size=5, n_layer=1, n_head=1, n_embd=4))\n"
            "print(model.generate(torch.zeros(1, 1, dtype=torch.long), 2, greedy=True).shape)\n"
            "from typed_transformer.cli import main\n"
            "sys.exit(main(['generate', '--checkpoint', 'nowhere']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.stdout == "torch.Size([1, 3])\n"
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == ("typed-transformer: error: generate needs the [train] extra: "
                                              f"{install_hint('train')} (missing: safetensors)")


@pytest.mark.parametrize(("command", "missing"), [("train", "tqdm"), ("generate", "safetensors")])
def test_train_and_generate_without_the_extra_name_it(command: str, missing: str, trained: tuple[Path, Path],
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    text, out = trained
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError, as when it is not installed
    argv = (["train", "--data", str(text), "--out", str(tmp_path / "run")] if command == "train"
            else ["generate", "--checkpoint", str(out)])
    capsys.readouterr()
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: {command} needs the [train] extra: "
                                                 f"{install_hint('train')} (missing: {missing})")
    assert not (tmp_path / "run").exists()


def test_generate_refuses_a_checkpoint_with_nan_weights(trained: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def nan_weight(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        tensors["model.ln_f.weight"] = torch.full_like(tensors["model.ln_f.weight"], float("nan"))

    _, out = trained
    bad = rewrite(out / CHECKPOINT_NAME, tmp_path / "nan.safetensors", nan_weight)
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(bad)]) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: {bad}: corrupt checkpoint (weight "
                                                 "ln_f.weight holds NaN or infinity)")


def test_generate_from_exploded_but_finite_weights_is_one_line(trained: tuple[Path, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def explode(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        tensors["model.tok_emb.weight"] = tensors["model.tok_emb.weight"] * 1e30  # finite, but the logits are not

    _, out = trained
    bad = rewrite(out / CHECKPOINT_NAME, tmp_path / "exploded.safetensors", explode)
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(bad), "--max-new-tokens", "3"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "typed-transformer: error: GPT.stream: the model's logits hold NaN or infinity, so no token can be drawn: "
        "its weights are finite but so large that the activations overflow (weights that exploded in a training run "
        "that diverged)")


# ---------------------------------------------------------------------------------------------------
# Checkpoints whose contents cannot be right: the cause named, the checkpoint kept
# ---------------------------------------------------------------------------------------------------

LIMITED_MEMORY = """import resource, sys
limit = 3 * 2**29  # address space: torch and a small model fit, a model of 2000 baby layers (1.6 GB) does not
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from typed_transformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["generate", "train"])
def test_a_config_asking_for_2000_layers_is_named_not_out_of_memory(command: str, copy: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    """The config of a re-signed checkpoint asks for 2000 layers beside the file's 4: the model is never
    allocated (it would need 1.6 GB; under a 1.5 GiB limit that was "out of memory: lower --batch-size")."""
    import json

    text, out = copy
    path = out / CHECKPOINT_NAME
    rewrite(path, path, lambda t, m: m.update(model_config=json.dumps({**json.loads(m["model_config"]),
                                                                       "n_layer": 2000})))
    before = path.read_bytes()
    argv = (["generate", "--checkpoint", str(path), "--max-new-tokens", "2"] if command == "generate" else
            ["train", "--data", str(text), "--out", str(out), "--resume", "--max-iters", "20", *TINY])
    done = subprocess.run([sys.executable, "-c", LIMITED_MEMORY, *argv], capture_output=True, text=True,
                          timeout=HANG_SECONDS, check=False)
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr).startswith(f"typed-transformer: error: {path}: weights do not fit the model "
                                            "(missing ['blocks.4.ln_1.weight'")
    assert path.read_bytes() == before


def test_a_model_that_fits_its_file_but_not_the_memory_says_so(trained: tuple[Path, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import typed_transformer.checkpoint as checkpoint_module
    from typed_transformer.gpt import GPT

    class NoMemory(GPT):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if torch.empty(0).device.type != "meta":  # the real model (its fit is checked on the meta device)
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                                   "memory: you tried to allocate 14155776000 bytes. Error code 12")
            super().__init__(*args, **kwargs)

    _, out = trained
    monkeypatch.setattr(checkpoint_module, "GPT", NoMemory)
    assert main(["generate", "--checkpoint", str(out / CHECKPOINT_NAME)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"typed-transformer: error: {out / CHECKPOINT_NAME}: out of memory building its model (")
    assert line.endswith(" GiB of float32 weights)")


@pytest.mark.parametrize(("change", "words"), [
    (lambda t, m: t.update({"model.ln_f.weight": t["model.ln_f.weight"].to(torch.int32)}),
     "weight ln_f.weight is torch.int32, expected torch.float32"),
    (lambda t, m: t.update({"optim.0.exp_avg_sq": -t["optim.0.exp_avg_sq"] - 1.0}),
     "optimizer tensor 0.exp_avg_sq holds a negative value"),
    (lambda t, m: t.update({"optim.0.step": t["optim.0.step"].to(torch.int64)}),
     "optimizer tensor 0.step is torch.int64, expected torch.float32 or torch.float64"),
], ids=["int32 weight", "negative exp_avg_sq", "int64 step"])
def test_resuming_a_re_signed_checkpoint_of_the_wrong_dtype_or_invariant(change: Any, words: str,
                                                                          copy: tuple[Path, Path],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Each of these loaded before (torch cast the int32 weight and the int64 step silently; the resumed run reported
    a loss of 606728896, or a negative exp_avg_sq as "training diverged"): one line, exit 2, checkpoint kept."""
    text, out = copy
    path = out / CHECKPOINT_NAME
    rewrite(path, path, change)
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["train", "--data", str(text), "--out", str(out), "--resume", "--max-iters", "20", *TINY]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"typed-transformer: error: {path}: corrupt checkpoint ({words}")
    assert path.read_bytes() == before


def test_a_fresh_model_too_large_for_the_memory_is_named_before_it_is_built(tmp_path: Path) -> None:
    """1000 layers of width 1024 (12.6 billion parameters, 187.5 GiB to train) under a 1.5 GiB limit: the model's
    size is the cause, found on the meta device before any allocation (it was "out of memory: lower --batch-size";
    without a limit the kernel's OOM killer would end the process without a word)."""
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--data", str(text), "--n-layer", "1000", "--n-embd", "1024", "--n-head", "8", "--out", str(out),
            *TINY]
    done = subprocess.run([sys.executable, "-c", LIMITED_MEMORY, *argv], capture_output=True, text=True,
                          timeout=HANG_SECONDS, check=False)
    assert done.returncode == 2, done.stderr
    line = done.stderr.splitlines()[-1]
    assert line.startswith("typed-transformer: error: not enough memory to train a model of 12,584,995,840 "
                           "parameters: its float32 weights, gradients and AdamW's two moments need 187.5 GiB more, "
                           "and this process can use "), done.stderr
    assert line.endswith("; lower --n-layer or --n-embd")
    assert "Traceback" not in done.stderr
    assert not (out / CHECKPOINT_NAME).exists()


def test_train_refuses_a_model_whose_training_state_does_not_fit(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """The API's train(): the model exists; its gradients and AdamW's moments (3 x 4 bytes a parameter) must fit."""
    from typed_transformer import _memory
    from typed_transformer.data import TextData
    from typed_transformer.gpt import GPT, GPTConfig
    from typed_transformer.training import TrainConfig, train

    data = TextData.from_text(TEXT, 8)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))
    count = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(_memory, "available_bytes", lambda: 12 * count - 1)
    config = TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, sample_tokens=0)
    steps: list[int] = []
    message = (f"not enough memory to train a model of {count:,} parameters: its float32 weights, gradients and "
               f"AdamW's two moments need {12 * count / 2**20:.0f} MiB more, and this process can use 0 MiB; train a "
               f"smaller model, or on a larger machine")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        train(model, data, config, tmp_path / "run", progress=False, on_step=steps.append)
    assert steps == []
    assert not (tmp_path / "run" / CHECKPOINT_NAME).exists()
    monkeypatch.setattr(_memory, "available_bytes", lambda: 12 * count)
    assert train(model, data, config, tmp_path / "run", progress=False, on_step=steps.append).iteration == 2


def test_every_case_of_the_reliability_script_is_a_row_of_the_page() -> None:
    """docs/reliability.md's tables are benchmarks/reliability_cases.py's output: a case added to the script (or
    renamed, or moved) without regenerating the page fails here."""
    from benchmarks import reliability_cases as script

    page = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert page.count(script.BEGIN) == 1
    assert page.count(script.END) == 1
    block = page.split(script.BEGIN, 1)[1].split(script.END, 1)[0]
    assert "Made by `benchmarks/reliability_cases.py` on " in block
    sections = [line.removeprefix("### ") for line in block.splitlines() if line.startswith("### ")]
    assert sections == script.SECTIONS
    assert block.count(script.HEADER) == len(script.SECTIONS)
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| Case |")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [case.name for case in script.CASES]
    assert [row.split(" | ")[1] for row in rows] == [f"`{script.shown(case)}`" for case in script.CASES]
    assert "(the script failed: " not in block
