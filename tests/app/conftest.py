"""Fixtures shared by the command-line tests of this folder."""

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged user ``nobody`` can enter (pytest's tmp_path is private to its owner), for the
    tests that run a command as that user; removed afterwards, whatever modes the test left inside it."""
    root = Path(tempfile.mkdtemp(prefix="typed-transformer-shared-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for path in root.rglob("*"):
            with contextlib.suppress(OSError):
                path.chmod(0o700)
        shutil.rmtree(root)
