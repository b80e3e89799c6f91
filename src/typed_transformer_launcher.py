"""The ``typed-transformer`` console script: catches Ctrl-C and SIGTERM while the package (and torch) is
still being imported, which a script pointing at ``typed_transformer.cli:main`` cannot do (the import happens
before ``main`` runs). From then on :func:`typed_transformer.cli.main` handles signals itself.

Kept outside the package on purpose: importing it imports nothing but the standard library.
"""

import signal
import sys
from types import FrameType

__all__ = ["main"]


class _Terminated(KeyboardInterrupt):
    pass


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main() -> int:
    """Import the command line and run it; one line and exit code 130/143 on a signal during the import."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        from typed_transformer.cli import main as cli_main
    except KeyboardInterrupt as interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        terminated = isinstance(interrupt, _Terminated)
        print(f"typed-transformer: {'terminated (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'}",
              file=sys.stderr)
        return 143 if terminated else 130
    code = cli_main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no traceback from a Ctrl-C during interpreter shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(main())
