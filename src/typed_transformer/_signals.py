"""Signals as exceptions: SIGTERM is raised as :class:`Terminated`, a ``KeyboardInterrupt`` (so every
``except KeyboardInterrupt`` clean-up runs for it as for Ctrl-C), and the command line maps both to one line
and exit code 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""

import signal
from types import FrameType

__all__ = ["Terminated", "exit_code", "raise_terminated"]


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (from ``kill``, a scheduler, ``torchrun``)."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: raise :class:`Terminated` in the main thread."""
    raise Terminated


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
