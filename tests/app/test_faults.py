"""Fault injection on the ``train`` command (issue 13, "Must show"): ``kill -9`` at random moments and in the
middle of writing the checkpoint, divergence, a second run into the same directory, an unwritable directory.

Each faulty run is a real process running the command line (``typed_transformer.cli.main``), forked from a
``forkserver`` that has imported torch once, so a run starts in milliseconds instead of seconds. The model is
the baby preset at block size 8 with a checkpoint every iteration, so that a random kill often lands in a save.
"""

import contextlib
import multiprocessing
import os
import random
import resource
import signal
import sys
import time
from collections.abc import Iterator
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.cli import TEXT, one_line
from tests.support.limits import HANG_SECONDS
from typed_transformer.checkpoint import CHECKPOINT_NAME, load_checkpoint, run_directory
from typed_transformer.cli import main

MAX_ITERS = 12
RUN = ["--block-size", "8", "--batch-size", "4", "--eval-interval", "4", "--eval-iters", "2", "--dropout", "0.1",
       "--checkpoint-interval", "1", "--sample-tokens", "0", "--no-progress", "--max-iters", str(MAX_ITERS)]
KILLS = 5  # random kill -9 moments
KILLS_IN_SAVE = 2  # kill -9 while the checkpoint file is being written


def temporaries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if ".tmp" in p.name)


# ---------------------------------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------------------------------


def _child(argv: list[str], log: str, marker: str, mode: str) -> None:
    """Run ``main(argv)`` with stderr in ``log``; ``mode`` injects a fault first. SIGHUP starts with the disposition
    of a terminal session (default), or ignored for ``mode="nohup"``, whatever the suite itself was started with
    (``nohup pytest`` hands every child an ignored SIGHUP, which the program rightly keeps)."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGHUP, signal.SIG_IGN if mode == "nohup" else signal.SIG_DFL)
    if mode == "hang-in-save":  # write the temporary file completely, then stop before the rename
        import safetensors.torch

        real = safetensors.torch.save_file

        def save_then_hang(tensors: dict[str, torch.Tensor], filename: str | os.PathLike[Any],
                           metadata: dict[str, str] | None = None) -> None:
            real(tensors, filename, metadata=metadata)
            Path(marker).write_text(str(filename))
            time.sleep(60)

        safetensors.torch.save_file = save_then_hang
    elif mode == "nobody":  # an unprivileged user, for whom a 0o555 directory is read-only even when tests run as root
        os.setgid(65534)
        os.setuid(65534)
    elif mode.startswith("fsize="):  # ulimit -f
        limit = int(mode.removeprefix("fsize="))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    stream = open(log, "w")  # noqa: SIM115 (left open: the interpreter may still write to stderr at exit)
    sys.stderr = stream
    code = main(argv)
    stream.flush()
    sys.exit(code)


@pytest.fixture(scope="module")
def forkserver() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "typed_transformer.cli", "typed_transformer.training",
                                    "safetensors.torch", "matplotlib.pyplot", "tests.support.fault_warmup", __name__])
    return context


class Run:
    def __init__(self, context: ForkServerContext, root: Path, argv: list[str], mode: str = "") -> None:
        self.log = root / f"log-{time.monotonic_ns()}.txt"
        self.marker = root / f"marker-{time.monotonic_ns()}"
        self.log.touch()
        self.log.chmod(0o666)  # writable by the unprivileged user of mode="nobody"
        self.process = context.Process(target=_child, args=(argv, str(self.log), str(self.marker), mode))
        self.process.start()

    def wait(self, timeout: float = HANG_SECONDS) -> int:
        self.process.join(timeout)
        assert self.process.exitcode is not None, "the run did not finish"
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no handler, no clean-up
        self.process.join()

    def wait_for_marker(self, timeout: float = HANG_SECONDS) -> str:
        deadline = time.monotonic() + timeout
        while not self.marker.exists():
            assert self.process.is_alive(), self.log.read_text()
            assert time.monotonic() < deadline, "the fault was never reached"
            time.sleep(0.01)
        time.sleep(0.05)
        return self.marker.read_text()

    @property
    def stderr(self) -> str:
        return self.log.read_text()


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def argv(text: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(text), "--out", str(out), *RUN, *extra]


# ---------------------------------------------------------------------------------------------------
# kill -9
# ---------------------------------------------------------------------------------------------------


def test_kill_9_never_loses_the_checkpoint_and_resuming_is_bit_exact(forkserver: ForkServerContext, text: Path,
                                                                     tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    uninterrupted = Run(forkserver, tmp_path, argv(text, reference))  # meanwhile, in its own process
    out = tmp_path / "killed"
    rng = random.Random(13)
    last = -1
    # The kills in the middle of a save come first: a run that random kills left unfinished for long enough
    # may complete (12 tiny iterations on a fast machine), and a finished run never saves again.
    plan = ["in-save"] * KILLS_IN_SAVE + ["random"] * KILLS
    for fault in plan:
        resume = ["--resume"] if (out / CHECKPOINT_NAME).exists() else []
        if fault == "in-save":
            run = Run(forkserver, tmp_path, argv(text, out, *resume), mode="hang-in-save")
            temporary = Path(run.wait_for_marker())
            run.kill()
            assert temporary.exists(), "the kill was meant to land between writing and renaming"
            assert temporary.parent == out
        else:
            run = Run(forkserver, tmp_path, argv(text, out, *resume))
            time.sleep(rng.uniform(0.1, 1.2))
            run.kill()
        if (out / CHECKPOINT_NAME).exists():
            saved = load_checkpoint(out)  # verified: hash, every field, finite weights
            assert last <= saved.iteration <= MAX_ITERS
            last = saved.iteration
    # The next start removes whatever temporary files the kills left.
    with run_directory(out):
        assert temporaries(out) == []
    if last < MAX_ITERS:
        resume = ["--resume"] if (out / CHECKPOINT_NAME).exists() else []
        finish = Run(forkserver, tmp_path, argv(text, out, *resume))
        assert finish.wait() == 0, finish.stderr
    assert temporaries(out) == []
    assert uninterrupted.wait() == 0, uninterrupted.stderr
    expected, got = load_checkpoint(reference), load_checkpoint(out)
    assert got.iteration == expected.iteration == MAX_ITERS
    assert got.history == expected.history
    for name, value in expected.model.state_dict().items():
        assert torch.equal(got.model.state_dict()[name], value), f"{name} differs after kill -9 and resume"


# ---------------------------------------------------------------------------------------------------
# Runs that must refuse to start
# ---------------------------------------------------------------------------------------------------


def test_a_fresh_run_over_a_checkpoint_refuses(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(argv(text, out, "--max-iters", "3")) == 0
    before = (out / CHECKPOINT_NAME).read_bytes()
    capsys.readouterr()
    assert main(argv(text, out, "--max-iters", "2")) == 2
    line = one_line(capsys.readouterr().err)
    assert line == (f"typed-transformer: error: {out / CHECKPOINT_NAME} exists: continue that run with --resume "
                    "or replace it with --overwrite")
    assert (out / CHECKPOINT_NAME).read_bytes() == before
    assert main(argv(text, out, "--max-iters", "2", "--overwrite")) == 0
    assert load_checkpoint(out).iteration == 2


def test_a_diverging_run_keeps_the_last_finite_checkpoint(text: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert main(argv(text, out, "--max-iters", "4")) == 0
    before = (out / CHECKPOINT_NAME).read_bytes()
    monkeypatch.setattr("typed_transformer.training.gpt_learning_rate", lambda config, iteration: 1e30)
    capsys.readouterr()
    assert main(argv(text, out, "--max-iters", "30", "--resume")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"typed-transformer: error: training diverged at iteration 5: the loss of the weights to be saved is nan; "
        f"kept the checkpoint of iteration 4 ({out / CHECKPOINT_NAME}); lower the learning rate (--lr)")
    assert (out / CHECKPOINT_NAME).read_bytes() == before
    saved = load_checkpoint(out)
    assert saved.iteration == 4
    assert all(bool(torch.isfinite(p).all()) for p in saved.model.parameters())


def test_a_second_run_into_the_same_directory_refuses(forkserver: ForkServerContext, text: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    first = Run(forkserver, tmp_path, argv(text, out), mode="hang-in-save")  # holds the lock, mid-save
    try:
        first.wait_for_marker()
        capsys.readouterr()
        for extra in ([], ["--resume"], ["--overwrite"]):
            assert main(argv(text, out, *extra)) == 2
            line = one_line(capsys.readouterr().err)
            assert line == (f"typed-transformer: error: {out}: another run is using this directory (pid "
                            f"{first.process.pid} holds {out / '.lock'}); wait for it to finish or choose another "
                            "--out")
        assert len(temporaries(out)) == 1  # the first run's file in progress was left alone
    finally:
        first.kill()


def test_a_read_only_out_fails_before_the_first_step(forkserver: ForkServerContext, shared_dir: Path) -> None:
    text = shared_dir / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    text.chmod(0o644)
    out = shared_dir / "read-only"
    out.mkdir()
    out.chmod(0o555)
    as_root = os.geteuid() == 0
    run = Run(forkserver, shared_dir, argv(text, out), mode="nobody" if as_root else "")
    code = run.wait()
    line = one_line(run.stderr)
    assert code == 2
    assert line == f"typed-transformer: error: {out}: not writable (Permission denied)"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda root: (root / "file").write_text("x") and root / "file", "{out}: exists and is not a directory"),
        (lambda root: (root / "file").write_text("x") and root / "file" / "run",
         "{out}: cannot be created, a part of the path is a file"),
    ],
)
def test_an_out_that_is_a_file_or_below_one(make: Any, words: str, text: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = make(tmp_path)
    assert main(argv(text, out)) == 2
    assert one_line(capsys.readouterr().err) == "typed-transformer: error: " + words.format(out=out)


def test_a_file_size_limit_fails_with_one_line_and_keeps_the_checkpoint(forkserver: ForkServerContext, text: Path,
                                                                        tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert Run(forkserver, tmp_path, argv(text, out, "--max-iters", "2")).wait() == 0
    before = (out / CHECKPOINT_NAME).read_bytes()
    run = Run(forkserver, tmp_path, argv(text, out, "--resume"), mode=f"fsize={len(before) // 2}")
    assert run.wait() == 2
    last = run.stderr.splitlines()[-1]
    assert "Traceback" not in run.stderr
    assert last.startswith(f"typed-transformer: error: cannot write: {out}/.checkpoint.safetensors.tmp-")
    assert last.endswith(": File too large (the last checkpoint, if any, is intact)")
    assert (out / CHECKPOINT_NAME).read_bytes() == before
    assert temporaries(out) == []


def test_a_full_disk_fails_with_one_line_and_keeps_the_checkpoint(text: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert main(argv(text, out, "--max-iters", "2")) == 0
    before = (out / CHECKPOINT_NAME).read_bytes()

    def full(tensors: dict[str, torch.Tensor], filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError(28, "No space left on device", filename)

    monkeypatch.setattr("safetensors.torch.save_file", full)
    capsys.readouterr()
    assert main(argv(text, out, "--resume")) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"typed-transformer: error: cannot write: {out}/.checkpoint.safetensors.tmp-")
    assert last.endswith(": No space left on device (the last checkpoint, if any, is intact)")
    assert (out / CHECKPOINT_NAME).read_bytes() == before
    assert temporaries(out) == []


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))


def test_too_little_free_space_is_refused_before_the_first_step(text: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk without room for two checkpoints is found before training (it was found at the first save, up to
    250 iterations in): one line, exit 2, nothing written, the last checkpoint kept."""
    out = tmp_path / "run"
    assert main(argv(text, out, "--max-iters", "2")) == 0
    before = (out / CHECKPOINT_NAME).read_bytes()
    _free(monkeypatch, 4096)
    for extra in (["--resume"], ["--overwrite"]):
        capsys.readouterr()
        assert main(argv(text, out, "--max-iters", "4", *extra)) == 2
        err = capsys.readouterr().err
        assert "iter " not in err  # no step was taken
        last = err.splitlines()[-1]
        assert last.startswith(f"typed-transformer: error: {out}: not enough free space for the run's checkpoints: "
                               f"4.0 KiB free, ")
        assert last.endswith("; free some space or choose another --out")
        assert "Traceback" not in err
        assert (out / CHECKPOINT_NAME).read_bytes() == before
        assert temporaries(out) == []
    fresh = tmp_path / "fresh"
    assert main(argv(text, fresh)) == 2
    assert not (fresh / CHECKPOINT_NAME).exists()


def test_the_space_check_asks_for_two_checkpoints_and_the_plot_less_what_is_there(
        text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typed_transformer.run_files import PLOT_ROOM, RunDirectoryError, checkpoint_bytes, require_free_space

    out = tmp_path / "run"
    assert main(argv(text, out, "--max-iters", "2")) == 0
    model = load_checkpoint(out / CHECKPOINT_NAME).model
    one = checkpoint_bytes(model, evaluations=5)
    present = (out / CHECKPOINT_NAME).stat().st_size + (out / "loss.png").stat().st_size
    needed = 2 * one + PLOT_ROOM - present
    _free(monkeypatch, needed)
    require_free_space(out, model, evaluations=5)  # exactly enough
    _free(monkeypatch, needed - 1)
    with pytest.raises(RunDirectoryError, match="not enough free space"):
        require_free_space(out, model, evaluations=5)


@contextlib.contextmanager
def _tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A real file system of ``size`` bytes at ``path`` (tmpfs: root only; the test is skipped where mounting is
    not allowed)."""
    import subprocess

    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode(errors='replace').strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_the_space_check_on_real_small_file_systems(text: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A file system just too small for two checkpoints is refused before the first step; one just large enough
    runs to the end, saving at every step (so two checkpoints do coexist): the estimate is neither too low nor
    far too high."""
    from typed_transformer.run_files import PLOT_ROOM, checkpoint_bytes

    out = tmp_path / "probe"
    assert main(argv(text, out, "--max-iters", "2")) == 0
    evaluations = MAX_ITERS // 4 + 2
    needed = 2 * checkpoint_bytes(load_checkpoint(out / CHECKPOINT_NAME).model, evaluations=evaluations) + PLOT_ROOM
    page = 4096
    with _tmpfs(tmp_path / "small", needed - needed % page - page) as small:
        capsys.readouterr()
        assert main(argv(text, small / "run")) == 2
        err = capsys.readouterr().err
        assert "iter " not in err
        assert err.splitlines()[-1].startswith(f"typed-transformer: error: {small / 'run'}: not enough free space ")
        assert not (small / "run" / CHECKPOINT_NAME).exists()
    with _tmpfs(tmp_path / "enough", needed - needed % page + 4 * page) as enough:  # and the directory, .lock
        assert main(argv(text, enough / "run")) == 0
        assert load_checkpoint(enough / "run" / CHECKPOINT_NAME).iteration == MAX_ITERS


# ---------------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------------


def _wait_for(run: "Run", text: str) -> None:
    deadline = time.monotonic() + HANG_SECONDS
    while text not in (run.stderr if run.log.exists() else ""):
        assert time.monotonic() < deadline, f"never printed {text!r}"
        assert run.process.is_alive(), run.stderr
        time.sleep(0.02)


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])  # a closed terminal as SIGTERM
def test_sigterm_saves_like_ctrl_c_and_exits_143(name: str, code: int, forkserver: ForkServerContext, text: Path,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = Run(forkserver, tmp_path, argv(text, out, "--max-iters", "100000", "--checkpoint-interval", "1000"))
    _wait_for(run, "iter     4:")
    assert run.process.pid is not None
    os.kill(run.process.pid, getattr(signal, name))
    assert run.wait() == code
    last = run.stderr.splitlines()[-1]
    assert "Traceback" not in run.stderr
    saved = load_checkpoint(out)
    assert last == (f"interrupted ({name}) at iteration {saved.iteration}; saved {out / CHECKPOINT_NAME} "
                    "(continue with --resume)")
    assert saved.iteration >= 4


def test_under_nohup_a_hangup_does_not_stop_the_run(forkserver: ForkServerContext, text: Path,
                                                    tmp_path: Path) -> None:
    """Started with SIGHUP ignored (``nohup``), the run keeps it ignored: a closed terminal does not stop training;
    SIGTERM still saves and exits 143."""
    out = tmp_path / "run"
    run = Run(forkserver, tmp_path, argv(text, out, "--max-iters", "100000", "--checkpoint-interval", "1000"),
              mode="nohup")
    _wait_for(run, "iter     4:")
    assert run.process.pid is not None
    os.kill(run.process.pid, signal.SIGHUP)
    _wait_for(run, "iter    12:")  # two evaluations later, still training
    os.kill(run.process.pid, signal.SIGTERM)
    assert run.wait() == 143
    assert "SIGHUP" not in run.stderr
    assert run.stderr.splitlines()[-1].startswith("interrupted (SIGTERM) at iteration ")
    assert load_checkpoint(out).iteration >= 12
