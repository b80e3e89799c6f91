"""Run files opened safely: a run's lock file is created or opened without following a link and must be a
regular file, and it is removed when the run that holds it ends; the files a command reads (checkpoints, text,
configs) must be regular files, so a FIFO or a device never blocks or floods a run. Standard library only."""

import errno
import os
import stat
from pathlib import Path

__all__ = ["NotARegularFile", "is_current", "is_held", "open_lock", "release_lock", "require_regular_file"]


class NotARegularFile(ValueError):
    """A path that should name a regular file names a link, a directory, a FIFO, a device or a socket."""


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def require_regular_file(path: str | Path, what: str) -> Path:
    """``path`` if it is (or links to) a regular file; a missing file is left to the caller's own message.

    Raises:
        NotARegularFile: ``path`` is a directory, FIFO, device or socket (``what`` names its role:
            "checkpoint", "--data", ...).
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path  # missing or unreadable: the open that follows names the real cause
    if not stat.S_ISREG(mode):
        raise NotARegularFile(f"{path}: {what} is {_kind(mode)}, not a regular file")
    return path


def open_lock(lock: Path) -> int:
    """Open (creating it if needed) the lock file ``lock`` for reading and writing, never through a link.

    Raises:
        NotARegularFile: ``lock`` is a symbolic link (never followed: a run would write its pid into the
            link's target), a directory, a FIFO or a device.
        OSError: it cannot be created or opened (read-only, permission).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(lock, flags, 0o666)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            mode = os.lstat(lock).st_mode
            raise NotARegularFile(f"{lock}: the run's lock file is {_kind(mode)}; remove it and run again") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotARegularFile(f"{lock}: the run's lock file is {_kind(mode)}; remove it and run again")
    os.set_blocking(fd, True)
    return fd


def is_current(lock: Path, fd: int) -> bool:
    """Whether ``lock`` still names the file open as ``fd`` (a finished run removes its lock file: a lock
    taken on the removed file locks nothing)."""
    try:
        here = os.stat(lock, follow_symlinks=False)
    except OSError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def release_lock(lock: Path, fd: int) -> None:
    """Remove the lock file (still locked, so no other run holds it) and close it, which releases the lock."""
    try:
        if is_current(lock, fd):
            os.unlink(lock)
    except OSError:
        pass  # a lock file left behind is harmless: the next run takes it
    finally:
        os.close(fd)


def is_held(lock: Path) -> bool:
    """Whether a live process holds ``lock`` (``fcntl.flock``; released by the kernel when its holder dies,
    however it dies). A missing lock file, a link or anything but a regular file counts as not held."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # taken and released at once: nobody held it
    finally:
        os.close(fd)
