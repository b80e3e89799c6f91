"""Run files: the lock is never opened through a link and is removed when a run ends; checkpoints, text and
config files must be regular files (a FIFO or a device is refused in one line instead of blocking)."""

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import one_line, run, train_run
from typed_transformer.checkpoint import CheckpointError, load_checkpoint
from typed_transformer.data import DataError, load_text
from typed_transformer.run_files import CHECKPOINT_NAME, LOCK_NAME, RunDirectoryError, run_directory

TINY = ["--block-size", "8", "--eval-interval", "5", "--eval-iters", "2", "--batch-size", "4", "--sample-tokens", "5",
        "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return train_run(tmp_path_factory.mktemp("run-files"), 3, TINY)


def test_a_finished_run_leaves_no_lock_file(trained: tuple[Path, Path]) -> None:
    _, out = trained
    assert (out / CHECKPOINT_NAME).is_file()
    assert not (out / LOCK_NAME).exists()


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(Path("..") / "victim.txt")
    with pytest.raises(RunDirectoryError, match=re.escape(f"{out / LOCK_NAME}: the run's lock file is a symbolic "
                                                          "link; remove it and run again")), run_directory(out):
        pass
    assert victim.read_text(encoding="utf-8") == "precious\n"
    assert (out / LOCK_NAME).is_symlink()  # left as it was


def test_a_dangling_symlinked_lock_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(tmp_path / "created-through-the-link")
    with pytest.raises(RunDirectoryError, match="is a symbolic link"), run_directory(out):
        pass
    assert not (tmp_path / "created-through-the-link").exists()


@pytest.mark.parametrize(("make", "kind"), [(os.mkdir, "a directory"), (os.mkfifo, "a FIFO")])
def test_a_lock_that_is_not_a_regular_file_is_named(make: Callable[[Path], None], kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    make(out / LOCK_NAME)
    with pytest.raises(RunDirectoryError, match=re.escape(f"{out / LOCK_NAME}: the run's lock file is {kind}")), \
            run_directory(out):
        pass


def test_the_command_line_refuses_a_symlinked_lock_in_one_line(trained: tuple[Path, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    text, _ = trained
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)
    capsys.readouterr()
    assert run(["train", "--data", str(text), "--max-iters", "2", *TINY, "--out", str(out)]) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: {out / LOCK_NAME}: the run's lock file "
                                                 "is a symbolic link; remove it and run again")
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_a_fifo_is_refused_as_checkpoint_text_and_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match=re.escape(f"{fifo}: the checkpoint is a FIFO, not a regular file")):
        load_checkpoint(fifo)
    with pytest.raises(DataError, match=re.escape(f"{fifo}: the text is a FIFO, not a regular file")):
        load_text(fifo)
    capsys.readouterr()
    assert run(["generate", "--checkpoint", str(fifo)]) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: {fifo}: the checkpoint is a FIFO, not a "
                                                 "regular file")
    assert run(["train", "--config", str(fifo), "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err) == (f"typed-transformer: error: --config {fifo}: the config file is a "
                                                 "FIFO, not a regular file")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_as_data_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(["train", "--data", "/dev/zero", "--out", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err) == ("typed-transformer: error: /dev/zero: the text is a character "
                                                 "device, not a regular file")


def _as_nobody(call: Callable[[], str]) -> str:
    """``call()`` in a forked child that is the unprivileged user ``nobody`` when the tests run as root (for whom
    every file is readable); its result, or the exception it raised, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            said = call()
        except BaseException as err:
            said = f"{type(err).__name__}: {err}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as stream:
        said = stream.read()
    os.waitpid(pid, 0)
    return said


def _refusal(path: Path) -> Callable[[], str]:
    def load() -> str:
        try:
            load_checkpoint(path)
        except CheckpointError as err:
            return f"CheckpointError: {err}"
        return "loaded"
    return load


def test_an_unreadable_checkpoint_says_permission_denied(trained: tuple[Path, Path], shared_dir: Path) -> None:
    # (as root, as the user nobody: the file is root's, mode 600)
    _, out = trained
    copy = shared_dir / CHECKPOINT_NAME
    copy.write_bytes((out / CHECKPOINT_NAME).read_bytes())
    copy.chmod(0o600 if os.geteuid() == 0 else 0)
    assert _as_nobody(_refusal(copy)) == f"CheckpointError: {copy}: cannot be read (Permission denied)"


def test_a_checkpoint_in_a_directory_that_cannot_be_entered_is_not_a_write_error(trained: tuple[Path, Path],
                                                                                shared_dir: Path) -> None:
    # path.exists() and path.is_dir() raise PermissionError there: the command said "cannot write: ...".
    _, out = trained
    private = shared_dir / "private"
    private.mkdir()
    (private / CHECKPOINT_NAME).write_bytes((out / CHECKPOINT_NAME).read_bytes())
    private.chmod(0o700 if os.geteuid() == 0 else 0)
    for given in (private / CHECKPOINT_NAME, private):
        said = _as_nobody(_refusal(given))
        assert said == f"CheckpointError: {private / CHECKPOINT_NAME}: cannot be read (Permission denied)"
