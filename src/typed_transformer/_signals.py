"""Signals as exceptions: SIGTERM is raised as :class:`Terminated`, a ``KeyboardInterrupt`` (so every
``except KeyboardInterrupt`` clean-up runs for it as for Ctrl-C), and the command line maps both to one line
and exit code 128 + signal number (130 for SIGINT, 143 for SIGTERM). SIGHUP (a closed terminal) is treated as
SIGTERM (exit code 129), unless the process was started with it ignored (``nohup``)."""

import signal
from types import FrameType

__all__ = ["TERMINATING", "Terminated", "exit_code", "raise_terminated", "signal_name"]


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (from ``kill``, a scheduler, ``torchrun``) or SIGHUP (a closed terminal,
    a dropped ssh session), which is treated as SIGTERM; ``signum`` says which."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


#: The signals that end a run as SIGTERM does (the first saves): SIGTERM, and SIGHUP unless it is ignored.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM (or SIGHUP) handler: raise :class:`Terminated` in the main thread."""
    raise Terminated(signum)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + (interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT)


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``, ``SIGHUP``)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
