"""Run files: the run directory a run writes into, locked for its lifetime, and the atomic writes of the files
in it (checkpoints of either model, a run's ``config.json``), with the sha256 integrity hash a checkpoint carries.

Guarantees (docs/reliability.md lists the faults they were tested against):

* Atomic: a file is written under a unique temporary name in the same directory, flushed to disk, then
  renamed over the old file (``os.replace``), so a crash or ``kill -9`` at any moment leaves either the
  old or the new file, never a mixture. Temporary files keep the process umask.
* Exclusive: :func:`run_directory` takes an ``fcntl.flock`` lock on ``<dir>/.lock`` for a run's lifetime (a
  second run into the same directory is refused; the lock file is never opened through a link and is removed
  when the run ends), removes temporary files left by killed runs, and checks that the directory is writable
  before the first step; :func:`require_free_space` checks that two checkpoints fit.

The GPT's checkpoint format is :mod:`~typed_transformer.checkpoint`'s, the encoder-decoder's
:mod:`~typed_transformer.seq2seq_training`'s. ``safetensors`` (the ``[train]`` extra) is imported only when a
file is written.
"""

import contextlib
import errno
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Shaped
from torch import Tensor, nn

from ._files import NotARegularFile, is_current, open_lock, release_lock
from ._paths import temporary_path
from .shapecheck import typechecked

__all__ = [
    "CHECKPOINT_NAME",
    "LOCK_NAME",
    "PLOT_ROOM",
    "RunDirectoryError",
    "checkpoint_bytes",
    "content_digest",
    "describe_os_error",
    "remove_temporaries",
    "require_free_space",
    "run_directory",
    "temporary_path",
    "write_atomically",
    "write_text_atomically",
]

CHECKPOINT_NAME = "checkpoint.safetensors"
LOCK_NAME = ".lock"


class RunDirectoryError(ValueError):
    """The run directory cannot be used (not a directory, not writable, locked by another run); one line."""


# ---------------------------------------------------------------------------------------------------
# Temporary files and the run directory
# ---------------------------------------------------------------------------------------------------


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files of earlier (killed) runs in ``directory``; returns what was removed.

    Call it only while holding the directory's lock (:func:`run_directory` does), so that no live run's
    temporary file is taken away. Also matches the names older versions used.
    """
    removed = []
    # Ours, older versions' names, and the ".tmpXXXXXX" files of the Rust tempfile crate, through which
    # safetensors itself writes before renaming onto the name it was given.
    patterns = (".*.tmp-*", f".{CHECKPOINT_NAME}.*.tmp", ".loss.png.tmp.png", ".tmp??????")
    for pattern in patterns:
        for path in directory.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and not path.is_symlink():
                    path.unlink()
                    removed.append(path)
    return removed


def describe_os_error(err: OSError) -> str:
    """``path: reason`` in one line, for a file-system error."""
    reason = err.strerror or (str(err).splitlines()[0] if str(err) else type(err).__name__)
    return f"{err.filename}: {reason}" if err.filename is not None else reason


_held: dict[Path, list[int]] = {}  # resolved directory -> [lock file descriptor, nesting depth]


@contextlib.contextmanager
def run_directory(directory: str | Path) -> Iterator[Path]:
    """Hold ``directory`` for one run: create it, lock it, clean it, check it is writable.

    The lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``directory/.lock`` (the file holds the owner's pid) and
    is released when the block ends or the process dies, however it dies. It is re-entrant within a process
    (the command line holds it around :func:`~typed_transformer.training.train`, which takes it too).

    Raises:
        RunDirectoryError: the path is a file or below a file, cannot be created or written (read-only,
            permission, disk full, file-size limit), or another process holds the lock.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RunDirectoryError(f"{directory}: exists and is not a directory") from None
    except NotADirectoryError:
        raise RunDirectoryError(f"{directory}: cannot be created, a part of the path is a file") from None
    except OSError as err:
        raise RunDirectoryError(f"{directory}: cannot create the run directory ({err.strerror})") from None
    if not directory.is_dir():
        raise RunDirectoryError(f"{directory}: exists and is not a directory")
    key = directory.resolve()
    if key in _held:
        _held[key][1] += 1
        try:
            yield directory
        finally:
            _held[key][1] -= 1
        return
    import fcntl

    lock = directory / LOCK_NAME
    try:
        fd = open_lock(lock)  # never through a link, only a regular file
    except NotARegularFile as err:
        raise RunDirectoryError(str(err)) from None
    except OSError as err:
        raise RunDirectoryError(f"{directory}: not writable ({err.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not is_current(lock, fd):  # locked the file of a run that has just ended and removed it
                raise BlockingIOError
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)  # not ours: the lock file stays
            fd = -1
            raise RunDirectoryError(f"{directory}: another run is using this directory (pid {owner or '?'} "
                                    f"holds {lock}); wait for it to finish or choose another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            remove_temporaries(directory)
            probe = temporary_path(directory / "write-test")
            with open(probe, "wb") as stream:
                stream.write(b"\0" * 4096)
                stream.flush()
                os.fsync(stream.fileno())
            probe.unlink()
        except OSError as err:
            raise RunDirectoryError(f"{directory}: not writable ({err.strerror})") from None
        _held[key] = [fd, 1]
        try:
            yield directory
        finally:
            del _held[key]
            with contextlib.suppress(OSError):
                remove_temporaries(directory)
    finally:
        if fd >= 0:
            release_lock(lock, fd)  # removes .lock (still locked) and closes it, which releases the lock


# ---------------------------------------------------------------------------------------------------
# Free space, before the first step
# ---------------------------------------------------------------------------------------------------

#: Room for the loss plot (``loss.png``, tens of KiB) and its temporary copy while it is replaced.
PLOT_ROOM = 2**20


def checkpoint_bytes(model: nn.Module, *, evaluations: int, optimizer: bool = True) -> int:
    """An upper bound of the size of ``model``'s checkpoint file (the GPT's or the encoder-decoder's), with
    Adam(W)'s state (two tensors of each parameter's size and a step count) and a history of ``evaluations``
    entries; within 64 KiB of the real size.

    The file is the tensors' bytes (a tensor shared by two names, tied weights, is stored once) plus a JSON
    header (a line per tensor, the metadata fields, the vocabulary); the header is bounded generously here, the
    tensors exactly.
    """
    stored = {v.untyped_storage().data_ptr(): v for v in model.state_dict().values()}.values()
    size: int = sum(v.numel() * v.element_size() for v in stored)
    count = len(stored) + 2  # the two random-number states
    size += 2 * torch.Generator().get_state().numel()
    if optimizer:
        parameters = {id(p): p for p in model.parameters() if p.requires_grad}.values()
        size += sum(2 * p.numel() * p.element_size() + 8 for p in parameters)
        count += 3 * len(parameters)
    vocabulary = sum(m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding))
    header = 200 * count + 128 * evaluations + 12 * vocabulary + 2**14
    return size + header


def require_free_space(directory: Path, model: nn.Module, *, evaluations: int) -> None:
    """Refuse to train into ``directory`` when its file system cannot hold the run's checkpoints: a save writes
    the new checkpoint beside the last one before replacing it, so two checkpoints (and the loss plot) must fit,
    less what the files already there take. Found before the first step instead of at the first save, which
    may be hundreds of iterations in. (Quotas and other writers can still fill the disk later: a failed save
    keeps the last checkpoint, see :func:`write_atomically`.)

    Raises:
        RunDirectoryError: not enough free space (one line: free, needed, per checkpoint).
    """
    import shutil

    one = checkpoint_bytes(model, evaluations=evaluations)
    present = sum(p.stat().st_size for p in (directory / CHECKPOINT_NAME, directory / "loss.png") if p.is_file())
    needed = 2 * one + PLOT_ROOM - present
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise RunDirectoryError(f"{directory}: not enough free space for the run's checkpoints: {_size(free)} free, "
                                f"{_size(needed)} needed (a checkpoint takes {_size(one)}; a save writes the new one "
                                "beside the last before replacing it); free some space or choose another --out")


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


# ---------------------------------------------------------------------------------------------------
# The integrity hash and atomic writes
# ---------------------------------------------------------------------------------------------------


def _tensor_bytes(value: Shaped[Tensor, "..."]) -> memoryview:
    flat = value.detach().cpu().contiguous().reshape(-1)
    array: Any = flat.view(torch.uint8).numpy()  # a view: no copy
    return memoryview(array)


def content_digest(tensors: dict[str, Shaped[Tensor, "..."]], metadata: dict[str, str]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, and every metadata field but the hash."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        digest.update(f"tensor\0{name}\0{value.dtype}\0{tuple(value.shape)}\0".encode())
        digest.update(_tensor_bytes(value))
    for key in sorted(metadata):
        if key != "sha256":
            digest.update(f"meta\0{key}\0{metadata[key]}\0".encode())
    return digest.hexdigest()


content_digest = typechecked(content_digest)


def _write_through_temporary(path: Path, fill: Callable[[Path], object]) -> None:
    """``fill`` a fresh temporary file beside ``path``, fsync it and rename it onto ``path``: ``path`` is the old
    file or the new one, never a torn one, and a symbolic link at ``path`` is replaced, never followed out of its
    directory. An OSError leaves the old file as it was and removes the temporary."""
    temporary = temporary_path(path)
    try:
        # O_EXCL on a fresh random name; mode 0o666 filtered by the umask, like any file the user creates.
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        mode = temporary.stat().st_mode & 0o777  # 0o666 less the umask; safetensors writes files 0o600
        fill(temporary)
        os.chmod(temporary, mode)
        with open(temporary, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible on every platform)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def write_text_atomically(path: Path, text: str) -> None:
    """Write a UTF-8 text file (a run's ``config.json``) as checkpoints are written: through a temporary file
    and a rename, never through a symbolic link at ``path``."""
    _write_through_temporary(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def write_atomically(path: Path, tensors: dict[str, Shaped[Tensor, "..."]], metadata: dict[str, str]) -> None:
    """Write a safetensors file through a temporary file, fsync and rename: ``path`` is the old file or the
    new one, never a torn one. An OSError leaves the old file as it was and removes the temporary."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    def fill(temporary: Path) -> None:
        try:
            save_file(tensors, str(temporary), metadata=metadata)
        except SafetensorError as err:  # its I/O errors end in "(os error N)": make them the OSError they are
            found = re.search(r"os error (\d+)", str(err))
            number = int(found.group(1)) if found else errno.EIO
            raise OSError(number, os.strerror(number), str(temporary)) from None

    _write_through_temporary(path, fill)


write_atomically = typechecked(write_atomically)
