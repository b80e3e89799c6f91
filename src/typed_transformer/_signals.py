"""Signals as exceptions: SIGTERM is raised as :class:`Terminated`, a ``KeyboardInterrupt`` (so every
``except KeyboardInterrupt`` clean-up runs for it as for Ctrl-C), and the command line maps both to one line
and exit code 128 + signal number (130 for SIGINT, 143 for SIGTERM). SIGHUP (a closed terminal) is treated as
SIGTERM (exit code 129), unless the process was started with it ignored (``nohup``).

Python runs a signal's handler in the main thread between two bytecodes, so one long C call (a torch kernel over
a huge input) would hold it back for as long as the call runs: :class:`Watchdog` answers within
:data:`GRACE_SECONDS` there too."""

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["GRACE_SECONDS", "TERMINATING", "Terminated", "Watchdog", "exit_code", "note_taken", "raise_interrupt",
           "raise_terminated", "signal_name"]

#: How long a signal waits for the main thread to take it before :class:`Watchdog` ends the process.
GRACE_SECONDS = 5.0
_taken = [0]  # how many signals the main thread's handlers have taken (one list: no global statement)


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (from ``kill``, a scheduler, ``torchrun``) or SIGHUP (a closed terminal,
    a dropped ssh session), which is treated as SIGTERM; ``signum`` says which."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


#: The signals that end a run as SIGTERM does (the first saves): SIGTERM, and SIGHUP unless it is ignored.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def note_taken() -> None:
    """Called by every handler of the package: the main thread has taken a signal (:class:`Watchdog` waits
    for this)."""
    _taken[0] += 1


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM (or SIGHUP) handler: raise :class:`Terminated` in the main thread."""
    note_taken()
    raise Terminated(signum)


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: Python's ``KeyboardInterrupt``, noted as taken."""
    note_taken()
    raise KeyboardInterrupt


class Watchdog:
    """Ends the process when the main thread does not take SIGINT, SIGTERM or SIGHUP within
    :data:`GRACE_SECONDS` (it is inside one long C call): one line on stderr and exit code 128 + the signal's
    number, as when the handler runs, but without clean-up (checkpoints are written atomically and locks are
    ``flock``s, so the last checkpoint on disk is whole and the run directory is free).

    How: Python's C-level handler writes each signal's number to the wakeup descriptor
    (:func:`signal.set_wakeup_fd`) at once, even while the main thread is busy in C; a daemon thread reads it and
    waits for the handlers' :func:`note_taken`. Torch's kernels release the GIL, so the thread runs beside them;
    a C call that holds the GIL throughout (a pure-Python builtin over a huge range) holds it back too.
    Hand-written: no library does this for a blocked main thread."""

    WATCHED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})

    def __init__(self, grace: float = GRACE_SECONDS) -> None:
        self.grace = grace
        self.received = 0
        self.closing = threading.Event()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Watch while the block runs (main thread only; elsewhere nothing is watched)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            os.close(read)
            os.close(write)
            yield
            return
        self.received, base = 0, _taken[0]
        thread = threading.Thread(target=self._watch, args=(read, base), name="signal-watchdog", daemon=True)
        thread.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)
            self.closing.set()
            os.close(write)  # the thread reads end-of-file and closes ``read``

    def _watch(self, read: int, base: int) -> None:
        try:
            while data := os.read(read, 64):
                for signum in data:
                    if signum in self.WATCHED:
                        self.received += 1
                        self._wait_for_the_main_thread(signum, base)
        finally:
            os.close(read)

    def _wait_for_the_main_thread(self, signum: int, base: int) -> None:
        deadline = self.grace
        while _taken[0] - base < self.received and deadline > 0 and not self.closing.is_set():
            self.closing.wait(0.05)
            deadline -= 0.05
        if _taken[0] - base >= self.received or self.closing.is_set():
            return
        name = signal_name(signum)
        said = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({name})"
        line = (f"typed-transformer: {said}: the computation under way did not give way within {self.grace:g} s; "
                "stopped without saving (the last checkpoint on disk is whole)\n")
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
        os._exit(128 + signum)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + (interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``, ``SIGHUP``)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
